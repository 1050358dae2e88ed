//! The apimachinery name rules (DNS-1123 label and subdomain, DNS-1035 label, qualified
//! name, label value, IANA_SVC_NAME, FQDN). Each returns the reason a value is not valid.

const LABEL_MAX: usize = 63;
const SUBDOMAIN_MAX: usize = 253;

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, optionally requiring a letter first.
fn is_rfc_label(s: &str, alpha_first: bool) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && (!alpha_first || b[0].is_ascii_lowercase())
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`: the name part of a qualified name and a
/// label value.
fn is_qualified_chars(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

fn too_long(s: &str, max: usize) -> Option<String> {
    (s.len() > max).then(|| format!("must be no more than {max} characters (is {})", s.len()))
}

fn join(errs: Vec<String>) -> Result<(), String> {
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

pub fn dns1123_label(s: &str) -> Result<(), String> {
    let mut errs: Vec<String> = too_long(s, LABEL_MAX).into_iter().collect();
    if !is_rfc_label(s, false) {
        errs.push(
            "must consist of lower case alphanumeric characters or '-', and must start and end \
             with an alphanumeric character (e.g. 'my-name' or '123-abc')"
                .into(),
        );
    }
    join(errs)
}

pub fn dns1035_label(s: &str) -> Result<(), String> {
    let mut errs: Vec<String> = too_long(s, LABEL_MAX).into_iter().collect();
    if !is_rfc_label(s, true) {
        errs.push(
            "must consist of lower case alphanumeric characters or '-', start with an \
             alphabetic character, and end with an alphanumeric character (e.g. 'my-name' or \
             'abc-123')"
                .into(),
        );
    }
    join(errs)
}

pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    let mut errs: Vec<String> = too_long(s, SUBDOMAIN_MAX).into_iter().collect();
    if !s.split('.').all(|l| is_rfc_label(l, false)) {
        errs.push(
            "must consist of lower case alphanumeric characters, '-' or '.', and must start and \
             end with an alphanumeric character (e.g. 'example.com')"
                .into(),
        );
    }
    join(errs)
}

/// A label key, annotation key or topology key: `[prefix/]name`.
pub fn qualified_name(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.split_once('/') {
        Some((_, n)) if n.contains('/') => {
            return Err(
                "must be a name with an optional DNS subdomain prefix and a single '/' \
                        (e.g. 'example.com/my-name')"
                    .into(),
            )
        }
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let mut errs = Vec::new();
    match prefix {
        Some("") => errs.push("prefix part must not be empty".to_string()),
        Some(p) => {
            if let Err(e) = dns1123_subdomain(p) {
                errs.push(format!("prefix part {e}"));
            }
        }
        None => {}
    }
    if name.is_empty() {
        errs.push("name part must not be empty".into());
    } else {
        if let Some(e) = too_long(name, LABEL_MAX) {
            errs.push(format!("name part {e}"));
        }
        if !is_qualified_chars(name) {
            errs.push(
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must \
                 start and end with an alphanumeric character (e.g. 'MyName', 'my.name' or \
                 '123-abc')"
                    .into(),
            );
        }
    }
    join(errs)
}

pub fn label_value(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    let mut errs: Vec<String> = too_long(s, LABEL_MAX).into_iter().collect();
    if !is_qualified_chars(s) {
        errs.push(
            "must be empty or consist of alphanumeric characters, '-', '_' or '.', and must \
             start and end with an alphanumeric character (e.g. 'MyValue', 'my_value' or '12345')"
                .into(),
        );
    }
    join(errs)
}

/// IANA_SVC_NAME (RFC 6335): what a named `targetPort` must be.
pub fn iana_svc_name(s: &str) -> Result<(), String> {
    let mut errs: Vec<String> = too_long(s, 15).into_iter().collect();
    let b = s.as_bytes();
    if !b
        .iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    {
        errs.push("must contain only lower case alphanumeric characters (a-z, 0-9) and '-'".into());
    }
    if !b.iter().any(|c| c.is_ascii_alphabetic()) {
        errs.push("must contain at least one letter (a-z)".into());
    }
    if s.contains("--") {
        errs.push("must not contain consecutive hyphens".into());
    }
    if s.starts_with('-') || s.ends_with('-') {
        errs.push("must not begin or end with a hyphen".into());
    }
    join(errs)
}

/// A fully qualified domain name (EndpointSlice `FQDN` addresses): a DNS-1123 subdomain of
/// at least two labels, with an optional trailing dot.
pub fn fqdn(s: &str) -> Result<(), String> {
    let t = s.strip_suffix('.').unwrap_or(s);
    dns1123_subdomain(t)?;
    if !t.contains('.') {
        return Err("must be a domain with at least two segments separated by dots".into());
    }
    Ok(())
}

/// A nearby valid DNS label for a hint: lower case, other characters turned into '-'.
pub fn suggest_label(s: &str, alpha_first: bool) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let mut t = out.trim_matches('-').to_string();
    if alpha_first {
        t = t
            .trim_start_matches(|c: char| !c.is_ascii_lowercase())
            .to_string();
    }
    t.truncate(LABEL_MAX);
    let t = t.trim_end_matches('-').to_string();
    (t != s && is_rfc_label(&t, alpha_first)).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        assert!(dns1123_label("web-1").is_ok());
        assert!(dns1123_label("1web").is_ok());
        assert!(dns1123_label("Web").is_err());
        assert!(dns1123_label("-web").is_err());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
        assert!(dns1035_label("1web").is_err());
        assert!(dns1035_label("web").is_ok());
        assert!(dns1123_subdomain("db.example.com").is_ok());
        assert!(dns1123_subdomain("db..example").is_err());
        assert!(fqdn("db.example.com.").is_ok());
        assert!(fqdn("db").is_err());
    }

    #[test]
    fn qualified_names_and_values() {
        assert!(qualified_name("app").is_ok());
        assert!(qualified_name("topology.kubernetes.io/zone").is_ok());
        assert!(qualified_name("app.kubernetes.io/Name_x").is_ok());
        assert!(qualified_name("/app").is_err());
        assert!(qualified_name("a/b/c").is_err());
        assert!(qualified_name("Example.com/app").is_err());
        assert!(qualified_name("app!").is_err());
        assert!(label_value("").is_ok());
        assert!(label_value("My_Value.1").is_ok());
        assert!(label_value("-x").is_err());
        assert!(label_value(&"v".repeat(64)).is_err());
    }

    #[test]
    fn port_names() {
        assert!(iana_svc_name("http").is_ok());
        assert!(iana_svc_name("http-alt2").is_ok());
        assert!(iana_svc_name("8080").is_err());
        assert!(iana_svc_name("http--x").is_err());
        assert!(iana_svc_name("a-very-long-port-name").is_err());
        assert!(iana_svc_name("HTTP").is_err());
    }

    #[test]
    fn suggestions() {
        assert_eq!(
            suggest_label("My_Service", true).as_deref(),
            Some("my-service")
        );
        assert_eq!(suggest_label("1st.web", true).as_deref(), Some("st-web"));
        assert_eq!(suggest_label("web", true), None);
    }
}
