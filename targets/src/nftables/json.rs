//! The `nft -j -f` form, built from the `nftables` crate's schema types.
//!
//! Each command is built as a crate type, serialised to a `serde_json::Value`, then patched
//! where the crate (0.6) cannot say what the text form says:
//! - maps of type `verdict` (`SetType` has no `verdict`): the map's `"map"` is set to `"verdict"`;
//! - table and chain comments (no `comment` field on `Table` / `Chain`): added;
//! - verdicts as map-element values (`Verdict::Drop` serialises as the bare string `"drop"`,
//!   which nft rejects): rewritten as the `{"drop": null}` object;
//! - element objects: `null` fields the crate always writes are removed.
//!
//! Affinity sets carry only the `timeout` flag: nft 1.0.6's JSON parser rejects `dynamic`,
//! and nft adds it itself because the set is the target of an `update` statement.
//!
//! The crate's flag fields are `HashSet`s; every one written here has a single member, so
//! the output stays deterministic.
//!
//! Layout: `{"nftables": [` then one command per line, so diffs stay line-oriented.

use super::model::*;
use super::names::{TABLE, TABLE_COMMENT};
use super::Options;
use nftables::expr::{self as ne, Expression, NamedExpression, SetItem};
use nftables::schema::{self as ns, NfCmd, NfListObject, NfObject, SetTypeValue};
use nftables::stmt::{self as st, Statement};
use nftables::types::{NfChainType, NfFamily, NfHook};
use serde_json::{json, Value as Json};
use std::borrow::Cow;
use std::collections::HashSet;
use svc_compiler::net::IpFamily;

pub(super) fn write(rs: &Ruleset, opts: &Options) -> String {
    let family = match rs.family {
        IpFamily::IPv4 => NfFamily::IP,
        IpFamily::IPv6 => NfFamily::IP6,
    };
    let mut cmds: Vec<Json> = Vec::new();
    let push = |cmds: &mut Vec<Json>, obj: NfObject<'_>| {
        cmds.push(serde_json::to_value(obj).expect("nftables schema serialises"));
    };

    push(
        &mut cmds,
        NfObject::ListObject(NfListObject::MetainfoObject(ns::MetainfoObject {
            version: None,
            release_name: None,
            json_schema_version: Some(1),
        })),
    );
    let table = || ns::Table {
        family,
        name: TABLE.into(),
        handle: None,
    };
    if opts.replace_table {
        push(&mut cmds, add(NfListObject::Table(table())));
        push(
            &mut cmds,
            NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(table()))),
        );
    }
    push(&mut cmds, add(NfListObject::Table(table())));
    cmds.last_mut().unwrap()["add"]["table"]["comment"] = json!(TABLE_COMMENT);

    for item in &rs.items {
        match item {
            Item::Section(_) => {}
            Item::Chain(c) => {
                let base = c.base;
                push(
                    &mut cmds,
                    add(NfListObject::Chain(ns::Chain {
                        family,
                        table: TABLE.into(),
                        name: c.name.to_string().into(),
                        newname: None,
                        handle: None,
                        _type: base.map(|b| match b.kind {
                            ChainType::Filter => NfChainType::Filter,
                            ChainType::Nat => NfChainType::NAT,
                        }),
                        hook: base.map(|b| match b.hook {
                            Hook::Prerouting => NfHook::Prerouting,
                            Hook::Input => NfHook::Input,
                            Hook::Forward => NfHook::Forward,
                            Hook::Output => NfHook::Output,
                            Hook::Postrouting => NfHook::Postrouting,
                        }),
                        prio: base.map(|b| b.priority),
                        dev: None,
                        policy: None,
                    })),
                );
                if let Some(cm) = c.comment {
                    cmds.last_mut().unwrap()["add"]["chain"]["comment"] = json!(cm);
                }
            }
            Item::Set(s) => {
                let set_type = key_type(rs.family, &s.key);
                let comment = s.comment.map(Cow::from);
                if s.verdict_map {
                    push(
                        &mut cmds,
                        add(NfListObject::Map(Box::new(ns::Map {
                            family,
                            table: TABLE.into(),
                            name: s.name.to_string().into(),
                            handle: None,
                            set_type,
                            // Placeholder: patched to "verdict" below.
                            map: SetTypeValue::Single(ns::SetType::Mark),
                            policy: None,
                            flags: None,
                            elem: None,
                            timeout: None,
                            gc_interval: None,
                            size: None,
                            comment,
                        }))),
                    );
                    cmds.last_mut().unwrap()["add"]["map"]["map"] = json!("verdict");
                } else {
                    push(
                        &mut cmds,
                        add(NfListObject::Set(Box::new(ns::Set {
                            family,
                            table: TABLE.into(),
                            name: s.name.to_string().into(),
                            handle: None,
                            set_type,
                            policy: None,
                            flags: s.timeout.map(|_| HashSet::from([ns::SetFlag::Timeout])),
                            elem: None,
                            timeout: s.timeout,
                            gc_interval: None,
                            size: None,
                            comment,
                        }))),
                    );
                }
            }
            Item::Rule(r) => push(
                &mut cmds,
                add(NfListObject::Rule(ns::Rule {
                    family,
                    table: TABLE.into(),
                    chain: r.chain.to_string().into(),
                    expr: r.stmts.iter().map(|s| stmt(rs.family, s)).collect(),
                    handle: None,
                    index: None,
                    comment: r.comment.map(Cow::from),
                })),
            ),
            Item::Element(e) => {
                let mut key = if e.key.len() == 1 {
                    value(&e.key[0])
                } else {
                    Expression::Named(NamedExpression::Concat(e.key.iter().map(value).collect()))
                };
                if let Some(cm) = &e.comment {
                    key = Expression::Named(NamedExpression::Elem(ne::Elem {
                        val: Box::new(key),
                        timeout: None,
                        expires: None,
                        comment: Some(cm.clone().into()),
                        counter: None,
                    }));
                }
                let elem = match &e.verdict {
                    Some(v) => Expression::List(vec![key, Expression::Verdict(verdict(v))]),
                    None => key,
                };
                push(
                    &mut cmds,
                    add(NfListObject::Element(ns::Element {
                        family,
                        table: TABLE.into(),
                        name: e.set.into(),
                        elem: vec![elem].into(),
                    })),
                );
                patch_element(&mut cmds.last_mut().unwrap()["add"]["element"]["elem"][0]);
            }
        }
    }

    let mut out = String::from("{\"nftables\": [\n");
    for (n, c) in cmds.iter().enumerate() {
        out.push_str(&c.to_string());
        out.push_str(if n + 1 < cmds.len() { ",\n" } else { "\n" });
    }
    out.push_str("]}\n");
    out
}

fn add(obj: NfListObject<'_>) -> NfObject<'_> {
    NfObject::CmdObject(NfCmd::Add(obj))
}

/// Removes the crate's `null` fields from `{"elem": …}` and turns bare verdict strings in
/// a `[key, verdict]` pair into verdict objects.
fn patch_element(elem: &mut Json) {
    let key = match elem {
        Json::Array(pair) => {
            if let Some(Json::String(v)) = pair.get(1) {
                let obj = json!({ v.clone(): null });
                pair[1] = obj;
            }
            &mut pair[0]
        }
        other => other,
    };
    if let Some(Json::Object(inner)) = key.get_mut("elem") {
        inner.retain(|_, v| !v.is_null());
    }
}

fn key_type(family: IpFamily, key: &[KeyType]) -> SetTypeValue<'static> {
    let t = |k: &KeyType| match (k, family) {
        (KeyType::Addr, IpFamily::IPv4) => ns::SetType::Ipv4Addr,
        (KeyType::Addr, IpFamily::IPv6) => ns::SetType::Ipv6Addr,
        (KeyType::InetProto, _) => ns::SetType::InetProto,
        (KeyType::InetService, _) => ns::SetType::InetService,
    };
    if key.len() == 1 {
        SetTypeValue::Single(t(&key[0]))
    } else {
        SetTypeValue::Concatenated(key.iter().map(t).collect())
    }
}

fn value(v: &Value) -> Expression<'static> {
    match v {
        Value::Ip(ip) => Expression::String(ip.to_string().into()),
        Value::Proto(p) => Expression::String(p.lower().into()),
        Value::Port(p) => Expression::Number(u32::from(*p)),
    }
}

fn verdict(v: &Verdict) -> ne::Verdict<'static> {
    match v {
        Verdict::Jump(t) => ne::Verdict::Jump(st::JumpTarget {
            target: t.to_string().into(),
        }),
        Verdict::Goto(t) => ne::Verdict::Goto(st::JumpTarget {
            target: t.to_string().into(),
        }),
        Verdict::Return => ne::Verdict::Return,
        Verdict::Drop => ne::Verdict::Drop,
    }
}

fn stmt(family: IpFamily, s: &Stmt) -> Statement<'static> {
    match s {
        Stmt::Match { left, op, right } => Statement::Match(st::Match {
            left: expr(family, left),
            right: expr(family, right),
            op: match op {
                // nft's implicit operator on a flag type (ct state) is a bit test.
                Op::Implicit if matches!(left, Expr::CtState | Expr::CtStatus) => st::Operator::IN,
                Op::Implicit | Op::Eq => st::Operator::EQ,
                Op::Neq => st::Operator::NEQ,
            },
        }),
        Stmt::Verdict(v) => match v {
            Verdict::Jump(t) => Statement::Jump(st::JumpTarget {
                target: t.to_string().into(),
            }),
            Verdict::Goto(t) => Statement::Goto(st::JumpTarget {
                target: t.to_string().into(),
            }),
            Verdict::Return => Statement::Return(None),
            Verdict::Drop => Statement::Drop(None),
        },
        Stmt::Reject => Statement::Reject(None),
        Stmt::MarkSet(e) => Statement::Mangle(st::Mangle {
            key: expr(family, &Expr::Mark),
            value: expr(family, e),
        }),
        Stmt::MasqueradeFullyRandom => Statement::Masquerade(Some(st::NAT {
            addr: None,
            family: None,
            port: None,
            flags: Some(HashSet::from([st::NATFlag::FullyRandom])),
        })),
        Stmt::VmapRef { key, map } => Statement::VerdictMap(st::VerdictMap {
            key: expr(family, key),
            data: Expression::String(format!("@{map}").into()),
        }),
        Stmt::VmapInline { key, entries } => Statement::VerdictMap(st::VerdictMap {
            key: expr(family, key),
            data: Expression::Named(NamedExpression::Set(
                entries
                    .iter()
                    .map(|(k, v)| {
                        SetItem::Mapping(Expression::Number(*k), Expression::Verdict(verdict(v)))
                    })
                    .collect(),
            )),
        }),
        Stmt::SetUpdate { set, elem } => Statement::Set(st::Set {
            op: st::SetOp::Update,
            elem: expr(family, elem),
            set: format!("@{set}").into(),
        }),
        Stmt::Dnat { addr, port } => Statement::DNAT(Some(st::NAT {
            addr: Some(Expression::String(addr.to_string().into())),
            family: None,
            port: Some(Expression::Number(u32::from(*port))),
            flags: None,
        })),
        // `model::build(view, Form::Json)` makes none (see `Form`).
        Stmt::MapUpdate { .. } | Stmt::DnatMap { .. } => {
            unreachable!("affinity maps are built for the text form only")
        }
    }
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(ne::Payload::PayloadField(
        ne::PayloadField {
            protocol: protocol.into(),
            field: field.into(),
        },
    )))
}

fn meta(key: ne::MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(ne::Meta { key }))
}

fn expr(family: IpFamily, e: &Expr) -> Expression<'static> {
    match e {
        Expr::Addr(side) => payload(
            ip_kw(family),
            match side {
                Side::Saddr => "saddr",
                Side::Daddr => "daddr",
            },
        ),
        Expr::L4proto => meta(ne::MetaKey::L4proto),
        Expr::ThDport => payload("th", "dport"),
        Expr::Mark => meta(ne::MetaKey::Mark),
        Expr::CtState => Expression::Named(NamedExpression::CT(ne::CT {
            key: "state".into(),
            family: None,
            dir: None,
        })),
        Expr::CtStatus => Expression::Named(NamedExpression::CT(ne::CT {
            key: "status".into(),
            family: None,
            dir: None,
        })),
        Expr::FibType(side) => Expression::Named(NamedExpression::Fib(ne::Fib {
            result: ne::FibResult::Type,
            flags: HashSet::from([match side {
                Side::Saddr => ne::FibFlag::Saddr,
                Side::Daddr => ne::FibFlag::Daddr,
            }]),
        })),
        Expr::Iifname => meta(ne::MetaKey::Iifname),
        Expr::NumgenRandom(n) => Expression::Named(NamedExpression::Numgen(ne::Numgen {
            mode: ne::NgMode::Random,
            ng_mod: *n,
            offset: None,
        })),
        Expr::Concat(parts) => Expression::Named(NamedExpression::Concat(
            parts.iter().map(|p| expr(family, p)).collect(),
        )),
        Expr::Ip(ip) => Expression::String(ip.to_string().into()),
        Expr::Prefix(c) => Expression::Named(NamedExpression::Prefix(ne::Prefix {
            addr: Box::new(Expression::String(c.addr.to_string().into())),
            len: u32::from(c.prefix),
        })),
        Expr::Num(n) | Expr::Hex(n) => Expression::Number(*n),
        Expr::Sym(s) => Expression::String((*s).into()),
        Expr::Ifname(s) => Expression::String(s.clone().into()),
        Expr::SetRef(s) => Expression::String(format!("@{s}").into()),
        Expr::AnonSet { items, .. } => Expression::Named(NamedExpression::Set(
            items
                .iter()
                .map(|i| SetItem::Element(expr(family, i)))
                .collect(),
        )),
        Expr::And(a, b) => Expression::BinaryOperation(Box::new(ne::BinaryOperation::AND(
            expr(family, a),
            expr(family, b),
        ))),
        Expr::Or(a, b) => Expression::BinaryOperation(Box::new(ne::BinaryOperation::OR(vec![
            expr(family, a),
            expr(family, b),
        ]))),
        Expr::Xor(a, b) => Expression::BinaryOperation(Box::new(ne::BinaryOperation::XOR(
            expr(family, a),
            expr(family, b),
        ))),
    }
}
