//! What the servers answer, as plain data: status, headers and body, made without I/O so
//! that tests compare them byte for byte. `http.rs` writes them; hyper adds `Date` and
//! `Content-Length` as Go's server does.

/// One HTTP answer. Header names as Go's server writes them (canonical case).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    #[cfg(test)]
    pub fn body_text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("UTF-8 body")
    }
}

/// A JSON answer with kube-proxy's two headers, then `extra`.
pub(crate) fn json(status: u16, extra: Vec<(&'static str, String)>, body: String) -> Reply {
    let mut headers = vec![
        ("Content-Type", "application/json".to_string()),
        ("X-Content-Type-Options", "nosniff".to_string()),
    ];
    headers.extend(extra);
    Reply {
        status,
        headers,
        body: body.into_bytes(),
    }
}

/// Go's `http.NotFound`, what a `ServeMux` answers for a path it does not know.
pub(crate) fn not_found() -> Reply {
    Reply {
        status: 404,
        headers: vec![
            ("Content-Type", "text/plain; charset=utf-8".to_string()),
            ("X-Content-Type-Options", "nosniff".to_string()),
        ],
        body: b"404 page not found\n".to_vec(),
    }
}

/// A service health check's answer (`service_health.go`, `hcHandler`): 200 when the
/// service has local endpoints and the proxy is healthy, else 503; the count in
/// `X-Load-Balancing-Endpoint-Weight`; the body tab-indented, without a final newline.
pub(crate) fn service_health(
    namespace: &str,
    name: &str,
    local_endpoints: usize,
    proxy_healthy: bool,
) -> Reply {
    let status = if local_endpoints != 0 && proxy_healthy {
        200
    } else {
        503
    };
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        go_quote(namespace),
        go_quote(name)
    );
    json(
        status,
        vec![(
            "X-Load-Balancing-Endpoint-Weight",
            local_endpoints.to_string(),
        )],
        body,
    )
}

/// Go's `%q` (`strconv.Quote`) for the text a Kubernetes name can hold: printable
/// characters as they are, `"` and `\` escaped, control characters as Go writes them.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_health_is_kube_proxys_answer() {
        let r = service_health("shop", "web", 2, true);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.headers,
            [
                ("Content-Type", "application/json".to_string()),
                ("X-Content-Type-Options", "nosniff".to_string()),
                ("X-Load-Balancing-Endpoint-Weight", "2".to_string()),
            ]
        );
        assert_eq!(
            r.body_text(),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        // No local endpoint, or an unhealthy proxy: 503 with the same shape.
        let r = service_health("shop", "web", 0, true);
        assert_eq!((r.status, r.headers[2].1.as_str()), (503, "0"));
        assert!(r.body_text().contains("\t\"localEndpoints\": 0,\n"));
        let r = service_health("shop", "web", 3, false);
        assert_eq!(r.status, 503);
        assert!(r
            .body_text()
            .ends_with("\t\"serviceProxyHealthy\": false\n}"));
    }

    #[test]
    fn quoting_is_gos() {
        assert_eq!(go_quote("kube-system"), "\"kube-system\"");
        assert_eq!(go_quote("a\"b\\c\td\u{1}é"), "\"a\\\"b\\\\c\\td\\x01é\"");
        assert_eq!(go_quote("\u{85}"), "\"\\u0085\"");
    }

    #[test]
    fn unknown_paths_get_gos_404() {
        let r = not_found();
        assert_eq!(r.status, 404);
        assert_eq!(r.body_text(), "404 page not found\n");
        assert_eq!(r.headers[0].1, "text/plain; charset=utf-8");
    }
}
