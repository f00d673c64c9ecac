//! Local stack for tests.
