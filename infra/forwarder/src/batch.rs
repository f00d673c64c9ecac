//! When a batch of pending pods closes: Karpenter's batching window. A batch
//! opens with its first pod and is sent once no pod joined it for the idle
//! duration (`BATCH_IDLE_DURATION`, 1 s) or once it has been open for the
//! maximum duration (`BATCH_MAX_DURATION`, 10 s), whichever comes first. A
//! lone pod waits one idle duration, not the whole window; a steady stream
//! is cut every maximum duration.
//! Pure: the caller passes the time, and times never go backwards.

use std::time::{Duration, Instant};

/// One batching window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchWindow {
    idle: Duration,
    max: Duration,
    /// (opened, last addition) while a batch is open.
    open: Option<(Instant, Instant)>,
}

impl BatchWindow {
    /// A closed window with these durations.
    pub fn new(idle: Duration, max: Duration) -> Self {
        BatchWindow { idle, max, open: None }
    }

    /// Something joined the batch at `now` (opening it when closed).
    pub fn add(&mut self, now: Instant) {
        self.open = Some(match self.open {
            Some((opened, _)) => (opened, now),
            None => (now, now),
        });
    }

    /// When the open batch is due: the earlier of its last addition plus the
    /// idle duration and its opening plus the maximum; None when closed.
    pub fn deadline(&self) -> Option<Instant> {
        self.open
            .map(|(opened, last)| (last + self.idle).min(opened + self.max))
    }

    /// Whether the open batch should be sent at `now`.
    pub fn is_due(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }

    /// The batch was sent: the window closes.
    pub fn close(&mut self) {
        self.open = None;
    }

    /// Whether a batch is open.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }
}
