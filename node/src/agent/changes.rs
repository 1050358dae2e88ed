//! What changed in the inputs between two applied syncs, as kube-proxy's change trackers
//! count it (`pkg/proxy/servicechangetracker.go`, `endpointschangetracker.go`): a
//! Service or an EndpointSlice added, changed or removed is one change, and a changed
//! EndpointSlice's `endpoints.kubernetes.io/last-change-trigger-time` is where its network
//! programming latency starts.
//!
//! kube-proxy learns of each object's events from the API server; the agent compares the
//! objects of the last applied sync with this sync's, by content ([`Object::print`]: the
//! object as decoded, its locations in the files left out, so that an edit elsewhere in a
//! file changes nothing here).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use svc_compiler::net::IpFamily;

/// One Service or EndpointSlice of the inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub kind: Kind,
    /// `namespace/name`.
    pub key: String,
    /// The object's content, without locations.
    pub print: u64,
    /// An EndpointSlice's `endpoints.kubernetes.io/last-change-trigger-time`, as written.
    pub trigger: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Service,
    /// An EndpointSlice of that address type; `None`: FQDN or unknown, which kube-proxy
    /// ignores.
    Slice(Option<IpFamily>),
}

/// The changes one sync applies.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    /// Services added, changed or removed.
    pub services: u64,
    /// EndpointSlices of the synced families added, changed or removed.
    pub slices: u64,
    /// The trigger times of the slices added or changed (not removed: a removed slice's
    /// annotation is from its last update), later than the agent's start (as kube-proxy
    /// ignores those before its tracker started), by family.
    pub triggers: Vec<(IpFamily, SystemTime)>,
}

/// The objects of the last applied sync.
#[derive(Debug)]
pub struct Tracker {
    start: SystemTime,
    last: BTreeMap<(bool, String), (Kind, u64)>,
}

/// Services and slices by key apart (a Service and a slice may share a name).
fn slot(o: &Object) -> (bool, String) {
    (matches!(o.kind, Kind::Slice(_)), o.key.clone())
}

impl Tracker {
    /// Nothing applied yet: the first sync's objects are all added, as kube-proxy's first
    /// list is all add events. Trigger times before `start` are not measured.
    pub fn new(start: SystemTime) -> Tracker {
        Tracker {
            start,
            last: BTreeMap::new(),
        }
    }

    /// From the last applied objects to `objects`, counting slices of `families` only.
    pub fn changes(&self, objects: &[Object], families: &[IpFamily]) -> Changes {
        let counted = |k: Kind| match k {
            Kind::Service => true,
            Kind::Slice(f) => f.is_some_and(|f| families.contains(&f)),
        };
        let mut out = Changes::default();
        let mut now: BTreeMap<(bool, String), &Object> = BTreeMap::new();
        for o in objects {
            now.insert(slot(o), o);
        }
        for (slot, o) in &now {
            let changed = self.last.get(slot).is_none_or(|(_, p)| *p != o.print);
            if !changed {
                continue;
            }
            match o.kind {
                Kind::Service => out.services += 1,
                Kind::Slice(f) if counted(o.kind) => {
                    out.slices += 1;
                    let family = f.expect("counted slices have a family");
                    if let Some(t) = o.trigger.as_deref().and_then(parse_rfc3339) {
                        if t > self.start {
                            out.triggers.push((family, t));
                        }
                    }
                }
                Kind::Slice(_) => {}
            }
        }
        for (slot, (kind, _)) in &self.last {
            if now.contains_key(slot) || !counted(*kind) {
                continue;
            }
            match kind {
                Kind::Service => out.services += 1,
                Kind::Slice(_) => out.slices += 1,
            }
        }
        out
    }

    /// `objects` were applied: the next sync's changes are from them.
    pub fn applied(&mut self, objects: &[Object]) {
        self.last = objects
            .iter()
            .map(|o| (slot(o), (o.kind, o.print)))
            .collect();
    }
}

/// Go's `time.Parse(time.RFC3339Nano, s)`: `2026-03-01T12:00:00Z`, with an optional
/// fraction of up to 9 digits and `Z` or a `±hh:mm` offset. `None` when it is not one
/// (kube-proxy then ignores the annotation).
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        (!part.is_empty() && part.bytes().all(|c| c.is_ascii_digit()))
            .then(|| part.parse().ok())
            .flatten()
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    if b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in(year, month) {
        return None;
    }
    if hour > 23 || min > 59 || sec > 59 {
        return None;
    }
    let mut i = 19;
    let mut nanos: i64 = 0;
    if b[i] == b'.' {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos = num(i + 1..i + 1 + digits)? * 10_i64.pow(9 - digits as u32);
        i += 1 + digits;
    }
    let offset = match &s[i..] {
        "Z" => 0,
        z if z.len() == 6 && (z.starts_with('+') || z.starts_with('-')) && &z[3..4] == ":" => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            let o = h * 3600 + m * 60;
            if z.starts_with('-') {
                -o
            } else {
                o
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + min * 60 + sec - offset;
    let whole = Duration::from_secs(secs.unsigned_abs());
    let t = if secs >= 0 {
        UNIX_EPOCH + whole
    } else {
        UNIX_EPOCH - whole
    };
    Some(t + Duration::from_nanos(nanos as u64))
}

fn days_in(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_times_parse_as_gos_rfc3339_nano() {
        let at = |secs: u64, nanos: u32| Some(UNIX_EPOCH + Duration::new(secs, nanos));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), at(0, 0));
        assert_eq!(
            parse_rfc3339("2026-03-01T12:00:00.5Z"),
            at(1_772_366_400, 500_000_000)
        );
        assert_eq!(
            parse_rfc3339("2000-02-29T11:59:59.123456789Z"),
            at(951_825_599, 123_456_789)
        );
        assert_eq!(
            parse_rfc3339("2026-03-01T14:00:00+02:00"),
            at(1_772_366_400, 0)
        );
        assert_eq!(
            parse_rfc3339("2026-03-01T11:30:00-00:30"),
            at(1_772_366_400, 0)
        );
        for bad in [
            "",
            "2026-03-01",
            "2026-03-01T12:00:00",
            "2026-03-01 12:00:00Z",
            "2026-02-29T12:00:00Z",
            "2026-03-01T24:00:00Z",
            "2026-03-01T12:00:00.Z",
            "2026-03-01T12:00:00.1234567890Z",
            "2026-03-01T12:00:00+0200",
            "2026-03-01T12:00:00z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    fn obj(kind: Kind, key: &str, print: u64, trigger: Option<&str>) -> Object {
        Object {
            kind,
            key: key.into(),
            print,
            trigger: trigger.map(String::from),
        }
    }

    #[test]
    fn changes_count_what_was_added_changed_or_removed_since_the_last_applied_sync() {
        let v4 = Kind::Slice(Some(IpFamily::IPv4));
        let v6 = Kind::Slice(Some(IpFamily::IPv6));
        let start = parse_rfc3339("2026-03-01T12:00:00Z").unwrap();
        let mut t = Tracker::new(start);
        let before = "2026-03-01T11:59:59Z";
        let after = "2026-03-01T12:00:07.25Z";
        let first = vec![
            obj(Kind::Service, "shop/web", 1, None),
            obj(v4, "shop/web", 2, Some(before)),
            obj(v6, "shop/web-v6", 3, None),
            obj(Kind::Slice(None), "shop/web-fqdn", 4, None),
        ];
        // Everything is added at first; the IPv6 and FQDN slices are not the node's; a
        // trigger time before the start is not measured.
        assert_eq!(
            t.changes(&first, &[IpFamily::IPv4]),
            Changes {
                services: 1,
                slices: 1,
                triggers: vec![]
            }
        );
        t.applied(&first);
        assert_eq!(t.changes(&first, &[IpFamily::IPv4]), Changes::default());
        let second = vec![
            obj(Kind::Service, "shop/web", 1, None),
            obj(v4, "shop/web", 5, Some(after)),
            obj(v6, "shop/web-v6", 6, Some(after)),
            obj(Kind::Service, "shop/db", 7, None),
            obj(v4, "shop/db", 8, Some("yesterday")),
        ];
        assert_eq!(
            t.changes(&second, &[IpFamily::IPv4, IpFamily::IPv6]),
            Changes {
                services: 1,
                slices: 3,
                triggers: vec![
                    (IpFamily::IPv4, parse_rfc3339(after).unwrap()),
                    (IpFamily::IPv6, parse_rfc3339(after).unwrap()),
                ]
            }
        );
        t.applied(&second);
        // Removed: counted, never measured.
        let third = vec![obj(v4, "shop/web", 5, Some(after))];
        assert_eq!(
            t.changes(&third, &[IpFamily::IPv4]),
            Changes {
                services: 2,
                slices: 1,
                triggers: vec![]
            }
        );
    }
}
