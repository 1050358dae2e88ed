//! kube-proxy's `/healthz` and `/livez` (`pkg/proxy/healthcheck/proxy_health.go`): the
//! state the agent reports after each sync, and the answers.
//!
//! Per IP family: `last_updated` (set by [`ProxyHealth::updated`] after a sync that
//! succeeded) and `oldest_pending` (set by [`ProxyHealth::queued`] when a sync is asked
//! for and none is pending, cleared by `updated`). Healthy: every family that was ever
//! updated has nothing pending, or has been pending for less than the health timeout
//! (kube-proxy: 2 × syncPeriod). A family never updated does not count, so the proxy is
//! healthy while it starts.

use super::answer::{json, Reply};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use svc_compiler::net::IpFamily;

/// The two clocks a health answer reads: the monotonic one for how long a sync has been
/// pending, the wall clock for the timestamps in the body.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now {
    pub mono: Instant,
    pub wall: SystemTime,
}

impl Now {
    pub fn read() -> Now {
        Now {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Family {
    last_updated: Option<SystemTime>,
    oldest_pending: Option<Instant>,
}

#[derive(Debug)]
struct State {
    families: [Family; 2],
    node_eligible: bool,
}

/// The proxy's health, shared by the agent (which reports) and the servers (which answer).
#[derive(Debug)]
pub(crate) struct ProxyHealth {
    timeout: Duration,
    state: Mutex<State>,
}

/// What [`ProxyHealth::health`] finds: kube-proxy's `ProxyHealth` without node eligibility.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Health {
    pub healthy: bool,
    /// The latest `last_updated` of all families; `None` before the first sync.
    pub last_updated: Option<SystemTime>,
    /// Each family ever updated, IPv4 first: its `last_updated` and whether it is healthy.
    pub status: Vec<(IpFamily, SystemTime, bool)>,
}

fn index(family: IpFamily) -> usize {
    match family {
        IpFamily::IPv4 => 0,
        IpFamily::IPv6 => 1,
    }
}

const FAMILIES: [IpFamily; 2] = [IpFamily::IPv4, IpFamily::IPv6];

impl ProxyHealth {
    /// `node_eligible` starts false: kube-proxy's node is unknown until it has read it.
    pub fn new(timeout: Duration) -> ProxyHealth {
        ProxyHealth {
            timeout,
            state: Mutex::new(State {
                families: [Family::default(); 2],
                node_eligible: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it (plain fields).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sync of `family` was asked for (`QueuedUpdate`).
    pub fn queued(&self, family: IpFamily, now: Now) {
        let mut s = self.lock();
        let f = &mut s.families[index(family)];
        f.oldest_pending.get_or_insert(now.mono);
    }

    /// `family`'s rules were synced (`Updated`).
    pub fn updated(&self, family: IpFamily, now: Now) {
        let mut s = self.lock();
        let f = &mut s.families[index(family)];
        f.oldest_pending = None;
        f.last_updated = Some(now.wall);
    }

    pub fn set_node_eligible(&self, eligible: bool) {
        self.lock().node_eligible = eligible;
    }

    pub fn node_eligible(&self) -> bool {
        self.lock().node_eligible
    }

    pub fn health(&self, now: Now) -> Health {
        let s = self.lock();
        let mut health = Health {
            healthy: true,
            last_updated: None,
            status: Vec::new(),
        };
        for family in FAMILIES {
            let f = s.families[index(family)];
            let Some(updated) = f.last_updated else {
                continue;
            };
            health.last_updated = health.last_updated.max(Some(updated));
            let late = f
                .oldest_pending
                .is_some_and(|p| now.mono.saturating_duration_since(p) >= self.timeout);
            health.healthy &= !late;
            health.status.push((family, updated, !late));
        }
        health
    }
}

/// Which of the two paths answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Health and node eligibility.
    Healthz,
    /// Health alone.
    Livez,
}

/// The answer to `probe`: 200 or 503, and kube-proxy's body (Go's `json.Marshal` of its
/// `ProxyHealth`: compact, fields in declaration order, `status` keys sorted, timestamps
/// in RFC 3339 with nanoseconds). A healthy answer reports `now` as `lastUpdated`, as
/// kube-proxy does for compatibility with releases where it meant "the loop ran".
pub(crate) fn answer(probe: Probe, health: &Health, node_eligible: bool, now: SystemTime) -> Reply {
    let healthy = match probe {
        Probe::Healthz => health.healthy && node_eligible,
        Probe::Livez => health.healthy,
    };
    let last_updated = if healthy {
        Some(now)
    } else {
        health.last_updated
    };
    let mut body = format!(
        "{{\"lastUpdated\":\"{}\",\"currentTime\":\"{}\"",
        rfc3339_nano(last_updated),
        rfc3339_nano(Some(now))
    );
    if probe == Probe::Healthz {
        body.push_str(&format!(",\"nodeEligible\":{node_eligible}"));
    }
    body.push_str(&format!(",\"healthy\":{}", health.healthy));
    if !health.status.is_empty() {
        let families: Vec<String> = health
            .status
            .iter()
            .map(|(family, updated, healthy)| {
                format!(
                    "\"{}\":{{\"lastUpdated\":\"{}\",\"healthy\":{healthy}}}",
                    family.as_str(),
                    rfc3339_nano(Some(*updated))
                )
            })
            .collect();
        body.push_str(&format!(",\"status\":{{{}}}", families.join(",")));
    }
    body.push('}');
    json(if healthy { 200 } else { 503 }, Vec::new(), body)
}

/// Go's `time.RFC3339Nano` in UTC (what `time.Time` marshals to): fractional seconds
/// without trailing zeros, none when whole; `None` is Go's zero time.
pub(crate) fn rfc3339_nano(t: Option<SystemTime>) -> String {
    let Some(t) = t else {
        return "0001-01-01T00:00:00Z".to_string();
    };
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            match d.subsec_nanos() {
                0 => (-(d.as_secs() as i64), 0),
                n => (-(d.as_secs() as i64) - 1, 1_000_000_000 - n),
            }
        }
    };
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let mut s = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    );
    if nanos != 0 {
        let frac = format!("{nanos:09}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push('Z');
    s
}

/// (year, month, day) of a day counted from 1970-01-01 (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Seconds since the epoch, as Prometheus' `SetToCurrentTime` writes a gauge.
pub(crate) fn unix_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Now, secs: f64) -> Now {
        let d = Duration::from_secs_f64(secs);
        Now {
            mono: base.mono + d,
            wall: base.wall + d,
        }
    }

    /// 2026-03-01T12:00:00.5Z.
    fn wall() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_772_366_400_500)
    }

    #[test]
    fn timestamps_are_gos_rfc3339_nano() {
        assert_eq!(rfc3339_nano(Some(UNIX_EPOCH)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_nano(Some(wall())), "2026-03-01T12:00:00.5Z");
        let t = UNIX_EPOCH + Duration::new(951_825_599, 123_456_789);
        assert_eq!(rfc3339_nano(Some(t)), "2000-02-29T11:59:59.123456789Z");
        let t = UNIX_EPOCH + Duration::new(4_107_542_400, 10);
        assert_eq!(rfc3339_nano(Some(t)), "2100-03-01T00:00:00.00000001Z");
        assert_eq!(rfc3339_nano(None), "0001-01-01T00:00:00Z");
        let before = UNIX_EPOCH - Duration::from_millis(1500);
        assert_eq!(rfc3339_nano(Some(before)), "1969-12-31T23:59:58.5Z");
    }

    #[test]
    fn pending_longer_than_the_timeout_is_unhealthy() {
        let base = Now {
            mono: Instant::now(),
            wall: wall(),
        };
        let h = ProxyHealth::new(Duration::from_secs(60));
        // Starting: nothing updated yet, healthy even with a sync pending for long.
        h.queued(IpFamily::IPv4, base);
        assert!(h.health(at(base, 3600.0)).healthy);
        h.updated(IpFamily::IPv4, at(base, 1.0));
        h.updated(IpFamily::IPv6, at(base, 2.0));
        h.queued(IpFamily::IPv6, at(base, 10.0));
        // A second request does not move the oldest pending one.
        h.queued(IpFamily::IPv6, at(base, 50.0));
        let ok = h.health(at(base, 69.9));
        assert!(ok.healthy, "{ok:?}");
        let late = h.health(at(base, 70.0));
        assert_eq!(
            late,
            Health {
                healthy: false,
                last_updated: Some(at(base, 2.0).wall),
                status: vec![
                    (IpFamily::IPv4, at(base, 1.0).wall, true),
                    (IpFamily::IPv6, at(base, 2.0).wall, false),
                ],
            }
        );
        // The sync finishes: healthy again.
        h.updated(IpFamily::IPv6, at(base, 80.0));
        assert!(h.health(at(base, 500.0)).healthy);
    }

    #[test]
    fn healthz_needs_an_eligible_node_livez_does_not() {
        let base = Now {
            mono: Instant::now(),
            wall: wall(),
        };
        let h = ProxyHealth::new(Duration::from_secs(60));
        h.updated(IpFamily::IPv4, base);
        let now = at(base, 5.0);
        let health = h.health(now);
        let healthz = answer(Probe::Healthz, &health, h.node_eligible(), now.wall);
        assert_eq!(healthz.status, 503);
        assert_eq!(
            healthz.body_text(),
            "{\"lastUpdated\":\"2026-03-01T12:00:00.5Z\",\"currentTime\":\"2026-03-01T12:00:05.5Z\",\
             \"nodeEligible\":false,\"healthy\":true,\
             \"status\":{\"IPv4\":{\"lastUpdated\":\"2026-03-01T12:00:00.5Z\",\"healthy\":true}}}"
        );
        assert_eq!(
            healthz.headers,
            [
                ("Content-Type", "application/json".to_string()),
                ("X-Content-Type-Options", "nosniff".to_string())
            ]
        );
        // Healthy: lastUpdated is now.
        let livez = answer(Probe::Livez, &health, false, now.wall);
        assert_eq!(livez.status, 200);
        assert_eq!(
            livez.body_text(),
            "{\"lastUpdated\":\"2026-03-01T12:00:05.5Z\",\"currentTime\":\"2026-03-01T12:00:05.5Z\",\
             \"healthy\":true,\
             \"status\":{\"IPv4\":{\"lastUpdated\":\"2026-03-01T12:00:00.5Z\",\"healthy\":true}}}"
        );
        h.set_node_eligible(true);
        let healthz = answer(Probe::Healthz, &health, h.node_eligible(), now.wall);
        assert_eq!(healthz.status, 200);
        assert!(healthz
            .body_text()
            .contains("\"nodeEligible\":true,\"healthy\":true"));
        // Before any sync: no status, Go's zero time unless healthy.
        let fresh = ProxyHealth::new(Duration::from_secs(60)).health(now);
        let healthz = answer(Probe::Healthz, &fresh, false, now.wall);
        assert_eq!(
            healthz.body_text(),
            "{\"lastUpdated\":\"0001-01-01T00:00:00Z\",\"currentTime\":\"2026-03-01T12:00:05.5Z\",\
             \"nodeEligible\":false,\"healthy\":true}"
        );
    }
}
