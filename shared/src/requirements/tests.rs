use super::*;
use proptest::prelude::*;

fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
    Requirement::new(key, op, values).unwrap()
}

/// A requirement as a manifest writes it: key, operator, values.
type Manifest<'a> = (&'a str, Operator, &'a [&'a str]);

/// Operator and values of a requirement on the one key a table uses.
type OpValues<'a> = (Operator, &'a [&'a str]);

fn reqs(list: &[Manifest<'_>]) -> Requirements {
    list.iter().map(|(k, o, v)| req(k, *o, v)).collect()
}

use Operator::*;

#[test]
fn builds_from_manifest_form() {
    assert!(matches!(
        Requirement::new("k", In, &[] as &[&str]),
        Err(RequirementError::InWithoutValues { .. })
    ));
    assert!(matches!(
        Requirement::new("k", Exists, &["a"]),
        Err(RequirementError::UnexpectedValues { .. })
    ));
    assert!(matches!(
        Requirement::new("k", Gt, &["a"]),
        Err(RequirementError::NotOneInteger { .. })
    ));
    assert!(matches!(
        Requirement::new("k", Lt, &["1", "2"]),
        Err(RequirementError::NotOneInteger { .. })
    ));
    assert_eq!(req("beta.kubernetes.io/arch", In, &["amd64"]).key, "kubernetes.io/arch");
}

#[test]
fn membership_table() {
    let table: &[(Operator, &[&str], &str, bool)] = &[
        (In, &["a", "b"], "a", true),
        (In, &["a", "b"], "c", false),
        (NotIn, &["a"], "a", false),
        (NotIn, &["a"], "b", true),
        (Exists, &[], "anything", true),
        (DoesNotExist, &[], "anything", false),
        (Gt, &["4"], "5", true),
        (Gt, &["4"], "4", false),
        (Gt, &["4"], "x", false),
        (Gte, &["4"], "4", true),
        (Gte, &["4"], "3", false),
        (Lt, &["4"], "3", true),
        (Lt, &["4"], "4", false),
        (Lte, &["4"], "4", true),
        (Lte, &["4"], "5", false),
        (Lt, &["4"], "-10", true),
    ];
    for (op, values, v, want) in table {
        assert_eq!(req("k", *op, values).has(v), *want, "{op} {values:?} has {v}");
    }
}

#[test]
fn operator_round_trip() {
    for (op, values) in [
        (In, vec!["a"]),
        (NotIn, vec!["a"]),
        (Exists, vec![]),
        (DoesNotExist, vec![]),
        (Gt, vec!["3"]),
        (Lt, vec!["3"]),
    ] {
        let r = req("k", op, &values);
        assert_eq!(r.operator(), op);
        let (_, op2, v2) = r.to_manifest();
        assert_eq!(Requirement::new("k", op2, &v2).unwrap(), r);
    }
    assert_eq!(req("k", Gte, &["3"]).operator(), Gt);
    assert_eq!(req("k", Gte, &["3"]).to_manifest().2, vec!["2"]);
}

#[test]
fn intersection_table() {
    // (a, b, expected members among the probe values)
    let probes = ["1", "2", "3", "4", "5", "a", "b", "c"];
    let table: &[(OpValues<'_>, OpValues<'_>, &[&str])] = &[
        ((In, &["a", "b"]), (In, &["b", "c"]), &["b"]),
        ((In, &["a", "b"]), (NotIn, &["b"]), &["a"]),
        ((NotIn, &["a"]), (NotIn, &["b"]), &["1", "2", "3", "4", "5", "c"]),
        ((In, &["a"]), (In, &["b"]), &[]),
        ((Exists, &[]), (In, &["a"]), &["a"]),
        ((Exists, &[]), (DoesNotExist, &[]), &[]),
        ((DoesNotExist, &[]), (NotIn, &["a"]), &[]),
        ((Gt, &["1"]), (Lt, &["4"]), &["2", "3"]),
        ((Gte, &["2"]), (Lte, &["3"]), &["2", "3"]),
        ((Gt, &["3"]), (Lt, &["4"]), &[]),
        ((In, &["1", "2", "5", "a"]), (Gt, &["1"]), &["2", "5"]),
        ((Gt, &["1"]), (NotIn, &["3"]), &["2", "4", "5"]),
        ((In, &["1", "2", "3"]), (Lt, &["3"]), &["1", "2"]),
    ];
    for ((oa, va), (ob, vb), want) in table {
        let a = req("k", *oa, va);
        let b = req("k", *ob, vb);
        for (x, y) in [(&a, &b), (&b, &a)] {
            let i = x.intersection(y);
            let got: Vec<&str> = probes.iter().copied().filter(|p| i.has(p)).collect();
            assert_eq!(&got, want, "{x} ∩ {y} = {i}");
        }
    }
}

#[test]
fn empty_bounds_collapse_to_does_not_exist() {
    let i = req("k", Gt, &["5"]).intersection(&req("k", Lt, &["6"]));
    assert!(i.is_empty());
    assert_eq!(i.operator(), DoesNotExist);
    let j = req("k", Gt, &["5"]).intersection(&req("k", Lt, &["8"]));
    assert_eq!(j.len(), 2);
    assert_eq!(j.any().as_deref(), Some("6"));
}

#[test]
fn min_values_take_the_larger() {
    let a = req("k", In, &["a", "b", "c"]).with_min_values(Some(2));
    let b = req("k", Exists, &[]).with_min_values(Some(3));
    assert_eq!(a.intersection(&b).min_values, Some(3));
}

#[test]
fn compatibility_table() {
    let pool = reqs(&[
        ("karpenter.sh/capacity-type", In, &["spot", "on-demand"]),
        ("kubernetes.io/arch", In, &["amd64"]),
        ("team", In, &["a"]),
    ]);
    let table: &[(&[Manifest<'_>], bool)] = &[
        (&[("kubernetes.io/arch", In, &["amd64"])], true),
        (&[("kubernetes.io/arch", In, &["arm64"])], false),
        (&[("kubernetes.io/arch", NotIn, &["arm64"])], true),
        // well-known keys the pool leaves open are allowed
        (&[("topology.kubernetes.io/zone", In, &["us-east-1a"])], true),
        (&[("node.kubernetes.io/instance-type", In, &["m5.large"])], true),
        // custom keys the pool does not define are not
        (&[("gpu", In, &["true"])], false),
        (&[("gpu", Exists, &[])], false),
        // ...unless they only exclude
        (&[("gpu", NotIn, &["true"])], true),
        (&[("gpu", DoesNotExist, &[])], true),
        (&[("team", In, &["a", "b"])], true),
        (&[("team", In, &["b"])], false),
        (&[("team", DoesNotExist, &[])], false),
        (&[("karpenter.sh/capacity-type", In, &["on-demand"])], true),
        (&[("karpenter.sh/capacity-type", In, &["reserved"])], false),
    ];
    for (pod, ok) in table {
        let pod = reqs(pod);
        assert_eq!(pool.compatible(&pod, true).is_ok(), *ok, "pool {pool} vs pod {pod}");
    }
    // Without the well-known allowance, undefined zone is rejected.
    let pod = reqs(&[("topology.kubernetes.io/zone", In, &["us-east-1a"])]);
    assert!(matches!(
        pool.compatible(&pod, false),
        Err(Incompatible::Undefined { .. })
    ));
}

#[test]
fn both_excluding_requirements_intersect() {
    let a = reqs(&[("k", NotIn, &["a"])]);
    let b = reqs(&[("k", DoesNotExist, &[])]);
    assert!(a.intersects(&b).is_ok());
    let c = reqs(&[("k", In, &["a"])]);
    assert!(c.intersects(&a).is_err());
}

#[test]
fn label_matching() {
    let r = reqs(&[
        ("a", In, &["1"]),
        ("b", NotIn, &["x"]),
        ("c", DoesNotExist, &[]),
        ("d", Gt, &["3"]),
    ]);
    let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    assert!(r.matches_labels(&labels(&[("a", "1"), ("d", "4")])));
    assert!(!r.matches_labels(&labels(&[("a", "1"), ("d", "3")])));
    assert!(!r.matches_labels(&labels(&[("a", "1"), ("d", "4"), ("c", "")])));
    assert!(!r.matches_labels(&labels(&[("a", "1"), ("d", "4"), ("b", "x")])));
    assert!(!r.matches_labels(&labels(&[("d", "4")])));
}

#[test]
fn unmet_min_values_reports_shortfall() {
    let r = reqs(&[("node.kubernetes.io/instance-type", Exists, &[])]);
    let mut r2 = Requirements::new();
    for q in r.iter() {
        r2.add(q.clone().with_min_values(Some(3)));
    }
    assert_eq!(
        r2.unmet_min_values(|_| 2),
        vec![("node.kubernetes.io/instance-type".to_string(), 3, 2)]
    );
    assert!(r2.unmet_min_values(|_| 3).is_empty());
}

fn arb_requirement() -> impl Strategy<Value = Requirement> {
    let values = proptest::collection::vec(prop_oneof!["[a-c]", "[0-6]"], 0..4);
    (0usize..8, values, 0i64..7).prop_map(|(op, vals, n)| {
        let n = n.to_string();
        match op {
            0 if !vals.is_empty() => req("k", In, &vals.iter().map(String::as_str).collect::<Vec<_>>()),
            0 | 1 => req("k", NotIn, &vals.iter().map(String::as_str).collect::<Vec<_>>()),
            2 => req("k", Exists, &[]),
            3 => req("k", DoesNotExist, &[]),
            4 => req("k", Gt, &[&n]),
            5 => req("k", Lt, &[&n]),
            6 => req("k", Gte, &[&n]),
            _ => req("k", Lte, &[&n]),
        }
    })
}

const PROBES: &[&str] = &["a", "b", "c", "d", "0", "1", "2", "3", "4", "5", "6", "7", "-1"];

proptest! {
    #[test]
    fn intersection_is_membership_and(a in arb_requirement(), b in arb_requirement()) {
        let i = a.intersection(&b);
        for p in PROBES {
            prop_assert_eq!(i.has(p), a.has(p) && b.has(p), "{} ∩ {} = {} at {}", a, b, i, p);
        }
    }

    #[test]
    fn intersection_commutes(a in arb_requirement(), b in arb_requirement()) {
        let x = a.intersection(&b);
        let y = b.intersection(&a);
        for p in PROBES {
            prop_assert_eq!(x.has(p), y.has(p));
        }
        prop_assert_eq!(x.is_empty(), y.is_empty());
    }

    #[test]
    fn intersection_is_idempotent_and_associative(a in arb_requirement(), b in arb_requirement(), c in arb_requirement()) {
        let aa = a.intersection(&a);
        let l = a.intersection(&b).intersection(&c);
        let r = a.intersection(&b.intersection(&c));
        for p in PROBES {
            prop_assert_eq!(aa.has(p), a.has(p));
            prop_assert_eq!(l.has(p), r.has(p));
        }
    }

    #[test]
    fn any_satisfies(a in arb_requirement()) {
        if let Some(v) = a.any() {
            prop_assert!(a.has(&v), "{} any {}", a, v);
        }
    }

    #[test]
    fn empty_means_no_member(a in arb_requirement(), b in arb_requirement()) {
        let i = a.intersection(&b);
        if i.is_empty() {
            for p in PROBES {
                prop_assert!(!i.has(p));
            }
        }
    }
}
