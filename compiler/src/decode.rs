//! Reading typed values out of the located tree, with diagnostics for wrong types and
//! unknown fields. Used by [`crate::k8s`].

use crate::diag::{Diagnostic, Diagnostics};
use crate::source::Span;
use crate::tree::{Entry, Node, Value};

/// A value and where it was written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sp<T> {
    pub v: T,
    pub span: Span,
}

impl<T> Sp<T> {
    pub fn new(v: T, span: Span) -> Self {
        Sp { v, span }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IntOrString {
    Int(i64),
    Str(String),
}

pub struct Decoder<'d> {
    pub diags: &'d mut Diagnostics,
}

/// The entries of one mapping, checked against the fields the kind knows.
pub struct Fields<'a> {
    entries: &'a [Entry],
    pub span: Span,
    /// Some key is written twice (SVC005 said so).
    repeated: bool,
}

impl<'a> Fields<'a> {
    /// The value of `key`; its last, where a mapping repeats it (as kubectl keeps it).
    pub fn get(&self, key: &str) -> Option<&'a Node> {
        self.entries
            .iter()
            .rev()
            .find(|e| e.key == key)
            .map(|e| &e.value)
            .filter(|n| n.value != Value::Null)
    }
    pub fn entries(&self) -> &'a [Entry] {
        self.entries
    }
}

/// A field path such as `spec.ports[0].nodePort`: links on the stack while decoding
/// descends, written out only when a diagnostic needs it.
#[derive(Clone, Copy, Debug)]
pub enum Path<'a> {
    /// Where the path starts: empty, or a prefix written as is (`data[config.conf]`).
    Root(&'a str),
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl<'a> Path<'a> {
    pub const ROOT: Path<'static> = Path::Root("");

    pub fn key(&'a self, key: &'a str) -> Path<'a> {
        Path::Key(self, key)
    }
    pub fn index(&'a self, i: usize) -> Path<'a> {
        Path::Index(self, i)
    }
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root(s) => f.write_str(s),
            Path::Key(Path::Root(""), key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

fn type_error(n: &Node, want: &str, path: &Path) -> Diagnostic {
    let found = match (&n.value, n.kind_name()) {
        // `1e23`, `8.5`: a number, but not the integer asked for.
        (Value::Scalar { text, .. }, "number") if want.contains("integer") => {
            format!("`{text}`")
        }
        (_, kind) => format!("a {kind}"),
    };
    let d = Diagnostic::error("SVC004", format!("`{path}` must be {want}, found {found}"))
        .at(n.span)
        .path(path.to_string());
    match (&n.value, want) {
        (Value::Scalar { plain: false, text }, w)
            if w.contains("integer") && text.parse::<i64>().is_ok() =>
        {
            d.hint(format!("remove the quotes: `{text}`"))
        }
        _ => d,
    }
}

impl Decoder<'_> {
    /// A mapping with known fields; unknown ones are warnings (SVC003). `known` = `None`
    /// accepts anything (server-owned status, free-form fields).
    pub fn map<'a>(
        &mut self,
        n: &'a Node,
        path: &Path,
        what: &str,
        known: Option<&[&str]>,
    ) -> Option<Fields<'a>> {
        let Value::Map(entries) = &n.value else {
            if n.value != Value::Null {
                self.diags.push(type_error(n, "a mapping", path));
            }
            return None;
        };
        if let Some(known) = known {
            for e in entries {
                if !known.contains(&e.key.as_str()) {
                    let mut d = Diagnostic::warning(
                        "SVC003",
                        format!("unknown field `{}` in {what}", e.key),
                    )
                    .at(e.key_span)
                    .path(path.key(&e.key).to_string());
                    if let Some(s) = closest(&e.key, known) {
                        d = d.hint(format!("did you mean `{s}`?"));
                    } else {
                        d = d.hint(
                            "kubectl's default --validate=strict makes the API server refuse it (with --validate=false it drops it); remove it or check the spelling",
                        );
                    }
                    self.diags.push(d);
                }
            }
        }
        // Linear in the keys (a Node may carry thousands of labels).
        let mut seen: std::collections::HashMap<&str, Span> =
            std::collections::HashMap::with_capacity(entries.len());
        let mut repeated = false;
        for e in entries {
            if let Some(&first) = seen.get(e.key.as_str()) {
                repeated = true;
                // kubectl keeps the last value and the API server takes the object
                // (kubernetes#125885): worth fixing, not a reason to refuse it.
                self.diags.push(
                    Diagnostic::warning("SVC005", format!("duplicate key `{}`", e.key))
                        .at(e.key_span)
                        .path(path.key(&e.key).to_string())
                        .related(first, "first written here")
                        .hint("kubectl keeps the last value (this one), as svc-compile does; remove the other"),
                );
            } else {
                seen.insert(&e.key, e.key_span);
            }
        }
        Some(Fields {
            entries,
            span: n.span,
            repeated,
        })
    }

    pub fn str_(&mut self, n: Option<&Node>, path: &Path) -> Option<Sp<String>> {
        let n = n?;
        match &n.value {
            Value::Null => None,
            Value::Scalar { text, .. } => Some(Sp::new(text.clone(), n.span)),
            _ => {
                self.diags.push(type_error(n, "a string", path));
                None
            }
        }
    }

    pub fn int(&mut self, n: Option<&Node>, path: &Path) -> Option<Sp<i64>> {
        let n = n?;
        match &n.value {
            Value::Null => None,
            Value::Scalar { text, plain: true } if text.parse::<i64>().is_ok() => {
                Some(Sp::new(text.parse().unwrap(), n.span))
            }
            _ => {
                self.diags.push(type_error(n, "an integer", path));
                None
            }
        }
    }

    pub fn bool_(&mut self, n: Option<&Node>, path: &Path) -> Option<Sp<bool>> {
        let n = n?;
        match &n.value {
            Value::Null => None,
            Value::Scalar { text, plain: true } if crate::tree::is_yaml11_bool(text) => {
                let v = crate::tree::yaml11_bool(text).unwrap_or(text.eq_ignore_ascii_case("true"));
                Some(Sp::new(v, n.span))
            }
            _ => {
                self.diags
                    .push(type_error(n, "a boolean (true or false)", path));
                None
            }
        }
    }

    pub fn int_or_string(&mut self, n: Option<&Node>, path: &Path) -> Option<Sp<IntOrString>> {
        let n = n?;
        match &n.value {
            Value::Null => None,
            Value::Scalar { text, plain: true } if text.parse::<i64>().is_ok() => {
                Some(Sp::new(IntOrString::Int(text.parse().unwrap()), n.span))
            }
            Value::Scalar { text, .. } => Some(Sp::new(IntOrString::Str(text.clone()), n.span)),
            _ => {
                self.diags
                    .push(type_error(n, "an integer or a string", path));
                None
            }
        }
    }

    pub fn seq<'a>(&mut self, n: Option<&'a Node>, path: &Path) -> &'a [Node] {
        let Some(n) = n else { return &[] };
        match &n.value {
            Value::Null => &[],
            Value::Seq(items) => items,
            _ => {
                self.diags.push(type_error(n, "a list", path));
                &[]
            }
        }
    }

    pub fn str_list(&mut self, n: Option<&Node>, path: &Path) -> Vec<Sp<String>> {
        let items = self.seq(n, path);
        let mut out = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            if let Some(s) = self.str_(Some(it), &path.index(i)) {
                out.push(s);
            }
        }
        out
    }

    /// A `map[string]string` (labels, selector, annotations), in written order; a repeated
    /// key keeps its first place and its last value.
    pub fn str_map(&mut self, n: Option<&Node>, path: &Path) -> Vec<(Sp<String>, Sp<String>)> {
        let Some(n) = n else { return Vec::new() };
        let Some(f) = self.map(n, path, "", None) else {
            return Vec::new();
        };
        let mut out: Vec<(Sp<String>, Sp<String>)> = Vec::new();
        // Only a mapping that repeats a key (rare) needs the index.
        let mut at: Option<std::collections::HashMap<&str, usize>> =
            f.repeated.then(std::collections::HashMap::new);
        for e in f.entries() {
            let p = path.key(&e.key);
            let v = match &e.value.value {
                Value::Null => Some(Sp::new(String::new(), e.value.span)),
                // kubectl reads these as numbers and booleans, which a map of strings
                // refuses ("cannot unmarshal number into ... of type string").
                Value::Scalar { text, plain: true }
                    if crate::tree::is_plain_number(text) || crate::tree::is_yaml11_bool(text) =>
                {
                    self.diags
                        .push(type_error(&e.value, "a string", &p).hint(format!(
                            "quote it: `\"{text}\"`; kubectl rejects an unquoted {}",
                            e.value.kind_name()
                        )));
                    None
                }
                _ => self.str_(Some(&e.value), &p),
            };
            let Some(v) = v else { continue };
            // A repeated key (a warning of `map`): the last value, as kubectl keeps it.
            if let Some(at) = &mut at {
                if let Some(&i) = at.get(e.key.as_str()) {
                    out[i].1 = v;
                    continue;
                }
                at.insert(e.key.as_str(), out.len());
            }
            out.push((Sp::new(e.key.clone(), e.key_span), v));
        }
        out
    }
}

/// The closest known name within edit distance 2, for "did you mean".
pub fn closest<'k>(word: &str, known: &[&'k str]) -> Option<&'k str> {
    let chars = word.chars().count();
    known
        .iter()
        // The distance is at least the difference in length: a long value (a typo of no
        // name) costs nothing here.
        .filter(|k| chars.abs_diff(k.chars().count()) <= 2)
        .map(|k| {
            (
                edit_distance(&word.to_ascii_lowercase(), &k.to_ascii_lowercase()),
                *k,
            )
        })
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::{Decoder, Path};
    use crate::diag::Diagnostics;
    use crate::source::FileId;

    #[test]
    fn booleans_are_read_as_yaml_1_1_spells_them() {
        let (docs, _) = crate::tree::parse_file(FileId(0), "[yes, No, off, ON, y, true, maybe]");
        let crate::tree::Value::Seq(items) = &docs[0].root.value else {
            panic!()
        };
        let mut diags = Diagnostics::default();
        let mut d = Decoder { diags: &mut diags };
        let got: Vec<Option<bool>> = items
            .iter()
            .map(|n| d.bool_(Some(n), &Path::ROOT).map(|b| b.v))
            .collect();
        let want = [true, false, false, true, true, true].map(Some);
        assert_eq!(got[..6], want);
        assert_eq!(got[6], None);
        assert_eq!(diags.items.len(), 1);
    }

    #[test]
    fn paths_are_written_as_field_paths() {
        let spec = Path::ROOT.key("spec");
        let ports = spec.key("ports");
        let port = ports.index(0);
        assert_eq!(port.key("nodePort").to_string(), "spec.ports[0].nodePort");
        assert_eq!(Path::ROOT.index(3).to_string(), "[3]");
        let conf = Path::Root("data[config.conf]");
        assert_eq!(conf.key("mode").to_string(), "data[config.conf].mode");
    }
}

/// A Go `time.Duration` string (`15m`, `1h30m`, `900s`, `0`, `1.5s`) in whole seconds,
/// truncated as `Duration.Seconds()` cast to an integer is. Negative values are errors
/// (kube-proxy rejects negative IPVS timeouts).
pub fn go_duration_secs(text: &str) -> Result<u32, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(0);
    }
    if t.starts_with('-') {
        return Err("must not be negative".into());
    }
    let mut rest = t.strip_prefix('+').unwrap_or(t);
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    let mut nanos: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("`{t}` is not a duration such as 900s or 15m"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("`{t}` has a number without a unit (write 900s)")),
            u => return Err(format!("`{t}`: unknown unit `{u}` (ns, us, ms, s, m, h)")),
        };
        rest = &rest[unit_len..];
        nanos += num * scale;
    }
    let secs = (nanos / 1e9).trunc();
    if secs > f64::from(u32::MAX) {
        return Err(format!("`{t}` is too long"));
    }
    Ok(secs as u32)
}

#[cfg(test)]
mod duration_tests {
    use super::go_duration_secs as d;

    #[test]
    fn go_durations() {
        assert_eq!(d("0"), Ok(0));
        assert_eq!(d("0s"), Ok(0));
        assert_eq!(d("900s"), Ok(900));
        assert_eq!(d("15m"), Ok(900));
        assert_eq!(d("1h2m3s"), Ok(3723));
        assert_eq!(d("1.9s"), Ok(1));
        assert_eq!(d("1500ms"), Ok(1));
        assert!(d("-5s").is_err());
        assert!(d("5").is_err());
        assert!(d("5d").is_err());
        assert!(d("").is_err());
    }
}

#[cfg(test)]
mod repeated_keys {
    use super::{Decoder, Path};
    use crate::diag::{Diagnostics, Severity};
    use crate::source::FileId;

    /// A repeated key is a warning, and the last value is the one read, as kubectl keeps
    /// it: in a `map[string]string` (keeping the key's first place) and in a field.
    #[test]
    fn the_last_value_wins_with_a_warning() {
        let text = "labels: {app: web, tier: db, app: shop}\nname: a\nname: b\n";
        let (docs, _) = crate::tree::parse_file(FileId(0), text);
        let root = &docs[0].root;
        let mut diags = Diagnostics::default();
        let mut d = Decoder { diags: &mut diags };
        let labels = d.str_map(root.get("labels"), &Path::ROOT.key("labels"));
        let got: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.v.as_str(), v.v.as_str()))
            .collect();
        assert_eq!(got, [("app", "shop"), ("tier", "db")]);
        let f = d.map(root, &Path::ROOT, "test", None).unwrap();
        assert_eq!(f.get("name").and_then(|n| n.as_str()), Some("b"));
        assert_eq!(root.get("name").and_then(|n| n.as_str()), Some("b"));
        let codes: Vec<(&str, Severity)> =
            diags.items.iter().map(|d| (d.code, d.severity)).collect();
        assert_eq!(
            codes,
            [("SVC005", Severity::Warning), ("SVC005", Severity::Warning)]
        );
    }
}
