//! Karpenter's scheduler reimplemented as a yardstick, and checks that a
//! plan keeps every scheduling rule.

pub mod checks;
pub mod karpenter;
