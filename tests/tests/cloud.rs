//! The local cloud (`nodesmith-local`): the stack users run, the demo's
//! stories, a burst, and at-least-once delivery. One cloud at a time: their
//! goals are counted in sweeps and observations, and two would share two cores.

mod delivery;
mod local_cloud;
mod table_loss;
