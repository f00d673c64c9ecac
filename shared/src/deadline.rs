//! The time an invocation has left. Lambda ends an invocation at its
//! deadline wherever it is; a handler that reads its [`Deadline`] instead
//! starts no work that would not fit before it and hands that work on (a
//! record given back to SQS, a step left to the next run).

use std::time::Duration;

use tokio::time::Instant;

/// Lambda's longest timeout: the deadline of work run outside Lambda (tests,
/// the CLI), where nothing ends it.
pub const LAMBDA_MAX: Duration = Duration::from_secs(15 * 60);

/// When an invocation must be done (a monotonic instant, so a clock step
/// during the invocation moves nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    /// A deadline at `at`.
    pub fn at(at: Instant) -> Self {
        Deadline { at }
    }

    /// A deadline `left` from now.
    pub fn after(left: Duration) -> Self {
        Deadline::at(Instant::now() + left)
    }

    /// The deadline of work outside Lambda: [`LAMBDA_MAX`] from now.
    pub fn outside_lambda() -> Self {
        Deadline::after(LAMBDA_MAX)
    }

    /// Lambda's deadline (`deadline_ms`, milliseconds since the epoch) as
    /// an instant, read when the wall clock says `now_ms` and the monotonic
    /// one `now` (pure). A deadline already past is `now`.
    pub fn from_epoch_ms(deadline_ms: u64, now_ms: u64, now: Instant) -> Self {
        Deadline::at(now + Duration::from_millis(deadline_ms.saturating_sub(now_ms)))
    }

    /// This deadline moved `margin` earlier: what a step must be done by to
    /// leave `margin` to the steps after it.
    pub fn earlier_by(self, margin: Duration) -> Self {
        // An instant too close to the clock's origin to subtract from is one
        // the process cannot have lived long enough to reach: already due.
        Deadline::at(self.at.checked_sub(margin).unwrap_or(self.at.min(Instant::now())))
    }

    /// The earlier of two deadlines.
    pub fn earliest(self, other: Deadline) -> Self {
        self.min(other)
    }

    /// The instant itself.
    pub fn instant(self) -> Instant {
        self.at
    }

    /// The time left now.
    pub fn remaining(self) -> Duration {
        self.remaining_at(Instant::now())
    }

    /// The time left at `now` (pure).
    pub fn remaining_at(self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    /// Whether the deadline has come.
    pub fn passed(self) -> bool {
        self.remaining().is_zero()
    }

    /// Whether at least `needed` is left now: a step that needs that long may start.
    pub fn leaves(self, needed: Duration) -> bool {
        self.remaining() >= needed
    }

    /// `work`, or `None` when the deadline comes first: the work is dropped
    /// where it stands (to the state, a crash there), so the invocation
    /// still answers instead of being ended by Lambda.
    pub async fn within<T>(self, work: impl Future<Output = T>) -> Option<T> {
        // On the heap: the work cut is a handler's whole step, and a debug
        // build's stack does not hold it copied through one more layer.
        tokio::time::timeout_at(self.at, Box::pin(work)).await.ok()
    }

    /// Where to count a time `budget` from, at `now`, so that it runs out
    /// no later than this deadline: `now` when the deadline leaves the whole
    /// budget, earlier by what it cuts off otherwise (pure).
    pub fn budget_start(self, budget: Duration, now: Instant) -> Instant {
        let cut = budget.saturating_sub(self.remaining_at(now));
        now.checked_sub(cut).unwrap_or(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lambdas_deadline_in_epoch_milliseconds_becomes_the_time_left() {
        let now = Instant::now();
        let d = Deadline::from_epoch_ms(1_700_000_060_000, 1_700_000_000_000, now);
        assert_eq!(d.remaining_at(now), Duration::from_secs(60));
        assert_eq!(d.remaining_at(now + Duration::from_secs(59)), Duration::from_secs(1));
        assert_eq!(d.remaining_at(now + Duration::from_secs(61)), Duration::ZERO);
        // One already past (a clock skew, a slow start) leaves nothing, and no panic.
        let past = Deadline::from_epoch_ms(1_000, 5_000, now);
        assert_eq!(past.remaining_at(now), Duration::ZERO);
        assert_eq!(
            d.earlier_by(Duration::from_secs(2)).remaining_at(now),
            Duration::from_secs(58)
        );
        assert_eq!(d.earliest(past), past);
    }

    #[test]
    fn a_budget_ends_at_the_deadline_when_the_deadline_comes_first() {
        let now = Instant::now() + Duration::from_secs(600);
        let budget = Duration::from_secs(45);
        let far = Deadline::at(now + Duration::from_secs(100));
        assert_eq!(far.budget_start(budget, now), now);
        let near = Deadline::at(now + Duration::from_secs(30));
        let start = near.budget_start(budget, now);
        assert_eq!(start + budget, near.instant());
        let gone = Deadline::at(now - Duration::from_secs(5));
        assert_eq!(
            gone.budget_start(budget, now) + budget,
            now,
            "nothing left: spent at once"
        );
    }
}
