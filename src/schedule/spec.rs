//! What a schedule says and when it is next due: a 5-field cron expression (read by `croner`,
//! in the schedule's zone, from `chrono-tz`) or `every <n>s|m|h|d` (a fixed interval from the
//! schedule's creation).
//!
//! Wall-clock times that a zone skips or repeats are settled here, not by the expression
//! library: the expression is matched against local wall-clock times, and each match becomes
//! an instant by the zone's rules — a time the zone skips (spring forward) fires once, at the
//! first valid instant after it (the end of the gap); a time it repeats (fall back) fires once,
//! at its first occurrence.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};

/// The most matches one search looks at (each skipped match is a repeated hour's second pass):
/// a bound, never reached by a valid expression.
const SEARCH_MAX: usize = 64;
/// The longest gap a zone's clock change leaves, searched minute by minute.
const GAP_MINUTES_MAX: i64 = 24 * 60;

/// A parsed schedule.
#[derive(Debug, Clone)]
pub enum Spec {
    /// A cron expression, as written.
    Cron(Box<Cron>, String),
    /// A fixed interval.
    Every(Duration),
}

/// Why a schedule was refused, in words for the person who wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "`{0}` is not a schedule: write a 5-field cron expression (minute hour day month weekday, e.g. `0 9 * * 1-5`) or `every <n>s|m|h|d` (e.g. `every 10m`)"
    )]
    Unreadable(String),
    #[error("`{0}` is not a valid cron expression: {1}")]
    BadCron(String, String),
    #[error("`{0}` never fires")]
    Never(String),
    #[error(
        "`{spec}` fires every {every}; the shortest interval allowed here is {min} (SSHMODE_SCHEDULE_MIN_SECS)"
    )]
    TooOften {
        spec: String,
        every: String,
        min: String,
    },
    #[error(
        "`{0}` is not a time zone: write one as `Area/City`, e.g. `Europe/Berlin` or `Asia/Shanghai`"
    )]
    BadZone(String),
}

/// Reads a zone name (`Area/City`, `UTC`).
pub fn zone(name: &str) -> Result<Tz, SpecError> {
    Tz::from_str(name.trim()).map_err(|_| SpecError::BadZone(name.chars().take(64).collect()))
}

/// A duration in words: `90 s`, `10 min`, `2 h`, `1 d`.
pub fn words(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 86_400 && s % 86_400 == 0 => format!("{} d", s / 86_400),
        s if s >= 3_600 && s % 3_600 == 0 => format!("{} h", s / 3_600),
        s if s >= 60 && s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

impl Spec {
    /// Parses `text`, refusing anything that fires more often than every `min`.
    pub fn parse(text: &str, min: Duration) -> Result<Spec, SpecError> {
        let text = text.trim();
        let shown = || text.chars().take(80).collect::<String>();
        let lower = text.to_ascii_lowercase();
        let spec = if let Some(rest) = lower.strip_prefix("every ") {
            Spec::Every(interval(rest.trim()).ok_or_else(|| SpecError::Unreadable(shown()))?)
        } else {
            if text.split_whitespace().count() != 5 || text.starts_with('@') {
                return Err(SpecError::Unreadable(shown()));
            }
            let cron = CronParser::builder()
                .seconds(Seconds::Disallowed)
                .build()
                .parse(text)
                .map_err(|e| SpecError::BadCron(shown(), e.to_string()))?;
            Spec::Cron(Box::new(cron), text.to_string())
        };
        let every = spec
            .shortest_gap()
            .ok_or_else(|| SpecError::Never(shown()))?;
        if every < min {
            return Err(SpecError::TooOften {
                spec: shown(),
                every: words(every),
                min: words(min),
            });
        }
        Ok(spec)
    }

    /// The first due time strictly after `after`, for a schedule in `tz` created at `anchor`.
    /// `None` when there is none (an expression that matches no more dates).
    pub fn next_after(
        &self,
        after: DateTime<Utc>,
        tz: Tz,
        anchor: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        match self {
            Spec::Every(d) => {
                let step = chrono::Duration::from_std(*d)
                    .ok()?
                    .num_milliseconds()
                    .max(1);
                let since = (after - anchor).num_milliseconds();
                let n = if since < 0 { 0 } else { since / step + 1 };
                Some(anchor + chrono::Duration::milliseconds(n * step))
            }
            Spec::Cron(cron, _) => {
                let mut from = after.with_timezone(&tz).naive_local();
                for _ in 0..SEARCH_MAX {
                    let wall = cron.find_next_occurrence(&from, false).ok()?;
                    if let Some(at) = instant(tz, wall)
                        && at > after
                    {
                        return Some(at);
                    }
                    from = wall;
                }
                None
            }
        }
    }

    /// The shortest time between two firings (`None`: it never fires). For an expression,
    /// measured over the matches of two years from a fixed date, in UTC.
    fn shortest_gap(&self) -> Option<Duration> {
        match self {
            Spec::Every(d) => Some(*d),
            Spec::Cron(cron, _) => {
                let start = NaiveDateTime::parse_from_str("2027-01-01 00:00", "%Y-%m-%d %H:%M")
                    .expect("a valid date");
                let mut prev = cron.find_next_occurrence(&start, true).ok()?;
                let mut gap: Option<chrono::Duration> = None;
                // Enough matches to see a pattern's densest stretch (a minute field's list);
                // bounded for expressions that match every minute.
                for _ in 0..1500 {
                    let Ok(next) = cron.find_next_occurrence(&prev, false) else {
                        break;
                    };
                    let g = next - prev;
                    gap = Some(gap.map_or(g, |m| m.min(g)));
                    if g <= chrono::Duration::minutes(1) {
                        break;
                    }
                    prev = next;
                }
                // One match only (a date that comes once): its gap is a year or more.
                Some(gap.map_or(Duration::from_secs(365 * 86_400), |g| {
                    g.to_std().unwrap_or_default()
                }))
            }
        }
    }

    /// The schedule as written.
    pub fn text(&self) -> String {
        match self {
            Spec::Cron(_, text) => text.clone(),
            Spec::Every(d) => {
                let s = d.as_secs();
                match s {
                    s if s % 86_400 == 0 => format!("every {}d", s / 86_400),
                    s if s % 3_600 == 0 => format!("every {}h", s / 3_600),
                    s if s % 60 == 0 => format!("every {}m", s / 60),
                    s => format!("every {s}s"),
                }
            }
        }
    }
}

/// `10m`, `30 s`, `2h`, `1d` (a positive number and a unit; at most a year).
fn interval(text: &str) -> Option<Duration> {
    let text = text.replace(' ', "");
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().ok().filter(|n| *n > 0)?;
    let unit = match unit {
        "s" | "sec" | "secs" | "second" | "seconds" => 1,
        "m" | "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hour" | "hours" => 3_600,
        "d" | "day" | "days" => 86_400,
        _ => return None,
    };
    let secs = n.checked_mul(unit).filter(|s| *s <= 366 * 86_400)?;
    Some(Duration::from_secs(secs))
}

/// The instant a local wall-clock time stands for in `tz`: itself; its first occurrence when
/// the zone repeats it; the end of the gap when the zone skips it.
fn instant(tz: Tz, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
        // Cron times are whole minutes, and zones change their clocks on whole minutes: the
        // first whole minute that exists after the time is the end of the gap.
        LocalResult::None => (1..=GAP_MINUTES_MAX).find_map(|m| {
            let later = wall + chrono::Duration::minutes(m);
            Some(
                tz.from_local_datetime(&later)
                    .earliest()?
                    .with_timezone(&Utc),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn min() -> Duration {
        Duration::from_secs(60)
    }

    #[test]
    fn schedules_are_read_and_refused_with_reasons() {
        for ok in [
            "0 9 * * 1-5",
            "*/5 * * * *",
            "30 2 * * *",
            "0 0 1 JAN *",
            "every 10m",
            "every 1h",
            "EVERY 2 d",
            "every 60s",
        ] {
            assert!(Spec::parse(ok, min()).is_ok(), "{ok}");
        }
        assert!(matches!(
            Spec::parse("0 9 * *", min()),
            Err(SpecError::Unreadable(_))
        ));
        assert!(matches!(
            Spec::parse("0 0 9 * * *", min()),
            Err(SpecError::Unreadable(_))
        ));
        assert!(matches!(
            Spec::parse("@daily", min()),
            Err(SpecError::Unreadable(_))
        ));
        assert!(matches!(
            Spec::parse("61 * * * *", min()),
            Err(SpecError::BadCron(..))
        ));
        assert!(matches!(
            Spec::parse("every 0m", min()),
            Err(SpecError::Unreadable(_))
        ));
        assert!(matches!(
            Spec::parse("every 5 weeks", min()),
            Err(SpecError::Unreadable(_))
        ));
        let e = Spec::parse("every 30s", min()).unwrap_err();
        assert_eq!(
            e,
            SpecError::TooOften {
                spec: "every 30s".into(),
                every: "30 s".into(),
                min: "1 min".into()
            }
        );
        // A minute list whose densest stretch is under the minimum.
        assert!(matches!(
            Spec::parse("0,1 * * * *", Duration::from_secs(120)),
            Err(SpecError::TooOften { .. })
        ));
        assert!(Spec::parse("0,30 * * * *", Duration::from_secs(1800)).is_ok());
        assert!(matches!(
            Spec::parse("0 0 30 2 *", min()),
            Err(SpecError::Never(_) | SpecError::BadCron(..))
        ));
        assert!(zone("Europe/Berlin").is_ok());
        assert!(zone("Mars/Olympus").is_err());
    }

    #[test]
    fn every_counts_from_its_anchor_and_skips_what_was_missed() {
        let s = Spec::parse("every 10m", min()).unwrap();
        let anchor = utc("2026-12-04T09:03:00Z");
        let next = |after: &str| s.next_after(utc(after), Tz::UTC, anchor).unwrap();
        assert_eq!(next("2026-12-04T09:03:00Z"), utc("2026-12-04T09:13:00Z"));
        assert_eq!(next("2026-12-04T09:12:59Z"), utc("2026-12-04T09:13:00Z"));
        assert_eq!(next("2026-12-04T09:13:00Z"), utc("2026-12-04T09:23:00Z"));
        // After an hour down: the next one after now, not the six it missed.
        assert_eq!(next("2026-12-04T10:14:00Z"), utc("2026-12-04T10:23:00Z"));
    }

    #[test]
    fn cron_reads_in_its_zone() {
        let s = Spec::parse("0 9 * * 1-5", min()).unwrap();
        let tz = zone("Asia/Shanghai").unwrap();
        let a = utc("2026-12-04T00:00:00Z"); // Friday 08:00 in Shanghai
        let next = s.next_after(a, tz, a).unwrap();
        assert_eq!(next, utc("2026-12-04T01:00:00Z"));
        // Then Monday.
        assert_eq!(
            s.next_after(next, tz, a).unwrap(),
            utc("2026-12-07T01:00:00Z")
        );
    }

    /// A daily 02:30 where the zone skips 02:00–03:00 fires once that day, at 03:00 (the first
    /// valid instant after it); where it repeats 01:00–02:00, a daily 01:30 fires once, at the
    /// first 01:30.
    #[test]
    fn skipped_and_repeated_wall_clock_times_fire_once() {
        let berlin = zone("Europe/Berlin").unwrap();
        let s = Spec::parse("30 2 * * *", min()).unwrap();
        let a = utc("2027-03-27T12:00:00Z");
        let day = s.next_after(a, berlin, a).unwrap();
        // 2027-03-28: clocks go from 02:00 CET to 03:00 CEST; 03:00 CEST = 01:00 UTC.
        assert_eq!(day, utc("2027-03-28T01:00:00Z"));
        let after = s.next_after(day, berlin, a).unwrap();
        assert_eq!(after, utc("2027-03-29T00:30:00Z"));

        let s = Spec::parse("30 1 * * *", min()).unwrap();
        let ny = zone("America/New_York").unwrap();
        let a = utc("2027-11-06T12:00:00Z");
        // 2027-11-07: 01:00–02:00 happens twice (EDT, then EST). The first 01:30 is EDT.
        let first = s.next_after(a, ny, a).unwrap();
        assert_eq!(first, utc("2027-11-07T05:30:00Z"));
        let next = s.next_after(first, ny, a).unwrap();
        assert_eq!(next, utc("2027-11-08T06:30:00Z"), "not again at 01:30 EST");
        // Found from inside the second pass, the day's firing is already behind.
        let inside = utc("2027-11-07T06:10:00Z");
        assert_eq!(
            s.next_after(inside, ny, a).unwrap(),
            utc("2027-11-08T06:30:00Z")
        );

        // Every five minutes through the gap: the gap's times collapse into one at 03:00.
        let s = Spec::parse("*/5 2 * * *", Duration::from_secs(300)).unwrap();
        let a = utc("2027-03-28T00:50:00Z"); // 01:50 CET
        let n = s.next_after(a, berlin, a).unwrap();
        assert_eq!(n, utc("2027-03-28T01:00:00Z"));
        let n2 = s.next_after(n, berlin, a).unwrap();
        assert_eq!(n2, utc("2027-03-29T00:00:00Z"), "once, not twelve times");
    }
}
