//! Appends failing in a row (pure): the ledger's store out of reach, the API server or the
//! database behind `baton server`. The run then waits, its lease kept, and retries: nothing
//! it did is lost. Past [`OUTAGE_WARNING`] it says so once in a Warning, and once more when
//! appends land again, so a person looking at a run that does not move sees why.

use std::time::{Duration, Instant};

/// How long appends may fail in a row before the run says so.
pub const OUTAGE_WARNING: Duration = Duration::from_secs(5);

/// The outage under way, if appends are failing.
#[derive(Debug, Default)]
pub struct Outage {
    since: Option<Instant>,
    warned: bool,
}

impl Outage {
    /// An append failed at `now`: how long they have been failing, when the Warning is due
    /// (once an outage).
    pub fn failed(&mut self, now: Instant) -> Option<Duration> {
        let lasted = now - *self.since.get_or_insert(now);
        if self.warned || lasted < OUTAGE_WARNING {
            return None;
        }
        self.warned = true;
        Some(lasted)
    }

    /// An append landed at `now`: how long the outage lasted, if its Warning was given.
    pub fn ended(&mut self, now: Instant) -> Option<Duration> {
        let since = self.since.take()?;
        std::mem::take(&mut self.warned).then(|| now - since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_told_once_past_the_threshold_and_its_end_only_if_told() {
        let t0 = Instant::now();
        let mut outage = Outage::default();
        assert_eq!(outage.failed(t0), None);
        assert_eq!(outage.failed(t0 + Duration::from_secs(2)), None);
        let told = outage.failed(t0 + OUTAGE_WARNING);
        assert_eq!(told, Some(OUTAGE_WARNING));
        assert_eq!(outage.failed(t0 + Duration::from_secs(30)), None, "once");
        let lasted = outage.ended(t0 + Duration::from_secs(40));
        assert_eq!(lasted, Some(Duration::from_secs(40)));
        assert_eq!(outage.ended(t0 + Duration::from_secs(41)), None);

        // A short failure, mended before the threshold, is nobody's business.
        let t1 = t0 + Duration::from_secs(100);
        assert_eq!(outage.failed(t1), None);
        assert_eq!(outage.ended(t1 + Duration::from_secs(1)), None);
        // And the next outage counts from its own start.
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(outage.failed(t2), None);
        assert_eq!(outage.failed(t2 + Duration::from_secs(4)), None);
    }
}
