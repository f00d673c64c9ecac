//! Disruption decisions (pure): which managed nodes one sweep pass would
//! disrupt and why, with the replacements it would launch, where every moved
//! pod goes and the money saved, plus the nodes a rule held and which rule.
//!
//! Made of small methods behind one trait ([`Method`]: judge, order, select),
//! one file each, tried in Karpenter's priority order: repair of unhealthy
//! nodes first (`repair.rs`: forceful, and not waiting for PDBs or
//! replacements), then expiry (forceful, it happens anyway), then drift (the node is wrong), then
//! emptiness (the node is idle), then consolidation of underutilized nodes
//! (`consolidation.rs`, only in passes where expiry and drift chose nothing,
//! as Karpenter runs one command at a time: their replacements would muddle
//! its price checks). One pass (`Pass`) holds what the methods share: budgets
//! (`budgets.rs`), PDB allowances and the rules that held nodes
//! (do-not-disrupt, controllerless pods, PDBs in `protection.rs`). Replacements and moves come from the
//! provisioning solver's what-if seam: the snapshot is compiled once and every
//! question is a [`SolveOptions`] with nodes removed. All decisions of one pass
//! are taken together: the last feasible solve, with every chosen node gone,
//! is the cluster after the pass, and each decision gets its part of it.
//!
//! `nodesmith simulate --disruption` prints these decisions; the `sweep`
//! carries them out across runs ([`progress`] says the next step of each,
//! `sweep::disrupt` acts; `docs/disruption.md`).

pub mod balanced;
pub mod budgets;
pub(crate) mod candidate;
pub mod consolidation;
pub(crate) mod drift;
pub(crate) mod emptiness;
pub(crate) mod expiration;
pub mod nomination;
pub mod progress;
pub(crate) mod protection;
pub mod repair;
pub mod resolved_drift;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Instant;

use jiff::Timestamp;

use crate::scheduling::{Compiled, NewNodeClaim, Plan, PodRef, SolveOptions};
use crate::snapshot::Snapshot;
pub use nomination::Nomination;

pub use crate::state::Reason;
pub use budgets::BudgetError;
use budgets::{Ledger, Refusal};
use candidate::Candidate;
use protection::PdbLedger;

/// A pod that moves, and where to: a node that stays, an in-flight claim, or
/// a replacement's name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Move {
    /// The pod.
    pub pod: PodRef,
    /// The node or NodeClaim it lands on.
    pub to: String,
}

/// Nodes removed for one reason in one pass, with what replaces them
/// (Karpenter's command).
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    /// Why.
    pub reason: Reason,
    /// Nodes removed, by name.
    pub nodes: Vec<String>,
    /// New nodes launched first (planned NodeClaims, as provisioning plans them).
    pub replacements: Vec<NewNodeClaim>,
    /// Every pod of the removed nodes that must move, once, by pod.
    pub moves: Vec<Move>,
    /// Removed nodes' prices minus the replacements' (per hour).
    pub savings_per_hour: f64,
}

/// The rule that kept a node from being disrupted in this pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Held {
    /// The node is annotated `karpenter.sh/do-not-disrupt: "true"`.
    DoNotDisruptNode,
    /// A pod on it is annotated `karpenter.sh/do-not-disrupt: "true"`.
    DoNotDisruptPod(PodRef),
    /// A pod with no controller would have to move (it would not come back).
    NoController(PodRef),
    /// A PodDisruptionBudget allows no more evictions this pass.
    Pdb {
        /// `namespace/name` of the PDB.
        pdb: String,
        /// The pod it keeps.
        pod: PodRef,
    },
    /// The NodePool's budget for the reason is used up.
    Budget {
        /// The NodePool.
        pool: String,
        /// The reason the budget was asked for.
        reason: Reason,
        /// Nodes the active budgets allow to be disrupting at once.
        allowed: usize,
    },
    /// A budget of the NodePool cannot be parsed: the pool allows nothing.
    InvalidBudget(BudgetError),
    /// Not empty for `consolidateAfter` yet.
    ConsolidateAfter {
        /// Seconds until it is.
        remaining_secs: u64,
    },
    /// `consolidateAfter: Never`.
    ConsolidationDisabled,
    /// Removing it saves nothing (its price is unknown or zero).
    NoSaving,
    /// It replaced disrupted nodes recently (churn control).
    RecentReplacement {
        /// Seconds until it may be consolidated.
        remaining_secs: u64,
    },
    /// It replaces a node still being disrupted, whose pods are yet to move
    /// onto it: empty now, it is where they are going.
    Receiving {
        /// The node it replaces.
        from: String,
    },
    /// A scheduling simulation gave it pending pods (Karpenter's nomination):
    /// no voluntary method takes it while that holds.
    Nominated(Nomination),
    /// No consolidation of it is worth doing, and why (Karpenter's `Unconsolidatable`).
    Unconsolidatable(String),
    /// Node repair waits: more of its NodePool's nodes are unhealthy than
    /// the cap allows ([`repair::over_cap`]).
    RepairCapped {
        /// The NodePool.
        pool: String,
        /// Its nodes with a health problem.
        unhealthy: usize,
        /// Its nodes.
        total: usize,
    },
    /// A pod of it cannot be placed anywhere with it gone.
    CannotPlace {
        /// The pod.
        pod: PodRef,
        /// Why, as the solver says it.
        why: String,
    },
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Held::DoNotDisruptNode => write!(f, "node has karpenter.sh/do-not-disrupt"),
            Held::DoNotDisruptPod(p) => write!(f, "pod {p} has karpenter.sh/do-not-disrupt"),
            Held::NoController(p) => write!(f, "pod {p} has no controller"),
            Held::Pdb { pdb, pod } => write!(f, "PodDisruptionBudget {pdb} does not allow evicting pod {pod}"),
            Held::Budget { pool, reason, allowed } => write!(
                f,
                "disruption budget of NodePool {pool} for {reason} allows {allowed} node(s) at once"
            ),
            Held::InvalidBudget(e) => write!(f, "disruption budget unusable: {e}"),
            Held::ConsolidateAfter { remaining_secs } => {
                write!(f, "consolidateAfter not reached ({remaining_secs}s left)")
            }
            Held::ConsolidationDisabled => write!(f, "consolidateAfter is Never"),
            Held::NoSaving => write!(f, "no cheaper placement (node price unknown)"),
            Held::RecentReplacement { remaining_secs } => {
                write!(f, "replacement node, not consolidated for another {remaining_secs}s")
            }
            Held::Receiving { from } => write!(f, "replacement for node {from}, whose pods have not moved yet"),
            Held::Nominated(n) => write!(f, "node is {n}"),
            Held::Unconsolidatable(why) => write!(f, "cannot consolidate: {why}"),
            Held::CannotPlace { pod, why } => write!(f, "pod {pod} cannot be placed elsewhere: {why}"),
            Held::RepairCapped { pool, unhealthy, total } => write!(
                f,
                "node repair blocked: {unhealthy} of {total} nodes of NodePool {pool} are unhealthy (more than {}%)",
                repair::ALLOWED_UNHEALTHY_PERCENT
            ),
        }
    }
}

/// A managed node a rule kept, and the rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocked {
    /// The node.
    pub node: String,
    /// The first rule that held it.
    pub rule: Held,
}

/// What a pass found of one managed node besides its decisions: what
/// Karpenter shows as the NodeClaim's `Drifted` and `Consolidatable`
/// conditions ([`crate::mirror`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeState {
    /// Why it is drifted; None when it is not.
    pub drifted: Option<String>,
    /// Since when `consolidateAfter` has passed since its last pod event;
    /// None while it has not, or with consolidation off (`Never`).
    pub consolidatable_since: Option<Timestamp>,
    /// Whether it has no pod a drain would evict.
    pub empty: bool,
}

/// Everything one pass decides.
#[derive(Debug, Clone, PartialEq)]
pub struct Decisions {
    /// At most one decision per reason, in priority order.
    pub decisions: Vec<Command>,
    /// Managed nodes a rule held, by name.
    pub blocked: Vec<Blocked>,
    /// Budgets that cannot be parsed (their pools allow nothing).
    pub errors: Vec<BudgetError>,
    /// The managed fleet's price per hour before the pass.
    pub price_before: f64,
    /// And after it (removed nodes gone, replacements added).
    pub price_after: f64,
    /// Every managed node's [`NodeState`], by node name.
    pub nodes: BTreeMap<String, NodeState>,
    /// How far consolidation got; None when it did not run this pass.
    pub consolidation: Option<Coverage>,
}

/// How far one pass's consolidation got: the nodes it could take, and how
/// many of them its deadline left unexamined (none: every one was considered).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Nodes its rules let it consider.
    pub candidates: usize,
    /// Of those, the ones neither taken nor tried before the deadline.
    pub unexamined: usize,
}

/// How a pass is decided.
#[derive(Debug, Clone, Default)]
pub struct DecideOptions {
    /// Nodes the shell found drifted by live resolution (a new AMI, subnets or
    /// security groups no longer selected), with why: the pure core cannot
    /// resolve those, so the sweep hands them in.
    pub resolved_drift: BTreeMap<String, String>,
    /// Replacement nodes of disruptions in progress, with the node each
    /// replaces: no voluntary method takes them until that node's
    /// disruption ends (Karpenter does not disrupt nodes nominated for pods).
    pub receiving: BTreeMap<String, String>,
    /// Nodes a claim names (registered): no other node is a candidate. The
    /// sweep sets it from the claims (its snapshot shows a joining node without
    /// its `karpenter.sh/unregistered` taint, as the solver must see it);
    /// None (`simulate`): every managed node without that taint.
    pub registered: Option<BTreeSet<String>>,
    /// Nodes `provision` nominated for pending pods, by node, still live
    /// ([`nomination::live`]); the pass adds its own placement of the
    /// snapshot's pending pods.
    pub nominated: BTreeMap<String, Nomination>,
    /// When the solver's cheaper-packing search, and consolidation's search, must stop
    /// (see [`SolveOptions::deadline`]).
    pub deadline: Option<Instant>,
    /// Consolidation's minimum saving, churn cooldown and spot rules.
    pub consolidation: consolidation::ConsolidationOptions,
    /// Whether a NodePool's `terminationGracePeriod` lets drift and expiry
    /// past do-not-disrupt pods and PDBs (Karpenter's eventual methods): the
    /// sweep sets it; `simulate`'s contract does not read that field.
    pub grace_period_bounds_eventual: bool,
    /// Node repair: on or off, and the tolerations.
    pub repair: repair::RepairOptions,
    /// Nodes whose EC2 status check is impaired, with since when (None: EC2
    /// did not say): the sweep reads them, `simulate` has none.
    pub impaired: BTreeMap<String, Option<Timestamp>>,
}

/// What the methods look at besides the candidate.
pub(crate) struct Context<'a> {
    /// The snapshot's moment.
    pub now: Timestamp,
    /// The snapshot.
    pub snapshot: &'a Snapshot,
    /// The pass's options.
    pub options: &'a DecideOptions,
}

/// A method's verdict on one candidate.
pub(crate) enum Verdict {
    /// Not this method's business.
    Skip,
    /// This method would disrupt it (protections and budgets permitting).
    Disrupt,
    /// This method would, but one of its own rules holds it.
    Held(Held),
}

/// One way of disrupting nodes (Karpenter's `Method`): which candidates it
/// wants ([`judge`](Method::judge)), in what order ([`order`](Method::order)),
/// and which of them it takes in a pass ([`select`](Method::select)).
pub(crate) trait Method {
    /// The reason its decisions carry.
    fn reason(&self) -> Reason;
    /// Ignores budgets and do-not-disrupt.
    fn forceful(&self) -> bool {
        false
    }
    /// Karpenter's eventual disruption (drift, expiry): with a
    /// `terminationGracePeriod`, do-not-disrupt pods and PDBs do not hold it.
    fn eventual(&self) -> bool {
        matches!(self.reason(), Reason::Drifted | Reason::Expired)
    }
    /// Whether the method applies to the node.
    fn judge(&self, c: &Candidate, cx: &Context) -> Verdict;
    /// The order candidates are taken in (budgets go to the first).
    fn order(&self, a: &Candidate, b: &Candidate) -> std::cmp::Ordering;
    /// Whether the method runs in a pass where earlier methods chose nodes
    /// for `earlier` reasons (every method does, but consolidation).
    fn runs_after(&self, _earlier: &[Reason]) -> bool {
        true
    }
    /// The candidates it disrupts in this pass, taken into `pass` (their
    /// budgets, PDB allowances and moves); what a rule held is noted there.
    /// By default every candidate it wants is admitted one at a time, then
    /// the batch is solved and nodes whose pods cannot be placed are dropped.
    fn select<'a>(&self, candidates: &'a [Candidate<'a>], pass: &mut Pass<'a>) -> Vec<&'a Candidate<'a>> {
        pass.admit_each(self, candidates)
    }
}

/// The methods in priority order: an unhealthy node is of no use, so repair
/// goes first; expiry happens regardless; a drifted node is wrong, an empty one merely idle; consolidation
/// comes last and only runs when expiry and drift chose nothing
/// ([`consolidation::Underutilized`]'s `runs_after`).
fn methods() -> [&'static dyn Method; 5] {
    [
        &repair::Repair,
        &expiration::Expiration,
        &drift::Drift,
        &emptiness::Emptiness,
        &consolidation::Underutilized,
    ]
}

/// Decides one pass over the snapshot at `snapshot.now`. The pending pods
/// are first placed as provisioning would place them: the nodes they land on
/// are nominated (no voluntary method takes them) and the room they take
/// stays taken in every what-if ([`nomination`]); pods that fit on no
/// existing capacity are provisioning's business and hold nothing back.
pub fn decide(snapshot: &Snapshot, options: &DecideOptions) -> Decisions {
    decide_with(snapshot, options, &methods())
}

/// [`decide`] with these methods, in this order (tests swap one for a reference).
fn decide_with(snapshot: &Snapshot, options: &DecideOptions, methods: &[&dyn Method]) -> Decisions {
    let candidates = candidate::collect(snapshot, options);
    let mut pass = Pass::new(snapshot, options, &candidates);
    let mut chosen: Vec<(Reason, Vec<&Candidate>)> = Vec::new();
    for m in methods {
        let earlier: Vec<Reason> = chosen.iter().map(|(r, _)| *r).collect();
        if !m.runs_after(&earlier) {
            continue;
        }
        let batch = m.select(&candidates, &mut pass);
        if !batch.is_empty() {
            chosen.push((m.reason(), batch));
        }
    }
    let errors = pass.ledger.errors();
    let states = candidates
        .iter()
        .map(|c| {
            let state = NodeState {
                drifted: drift::drifted(c, &pass.cx),
                consolidatable_since: c.consolidatable_since(snapshot.now),
                empty: c.is_empty(),
            };
            (c.name.clone(), state)
        })
        .collect();
    Decisions {
        nodes: states,
        consolidation: pass.coverage,
        ..assemble(&candidates, chosen, pass.blocked, pass.plan, errors)
    }
}

/// The state of one pass: the what-if solves, the ledgers every method
/// draws on (budgets, PDBs) and the rules that held nodes.
pub(crate) struct Pass<'a> {
    /// What the methods look at.
    cx: Context<'a>,
    /// The snapshot compiled once, the pending pods' placement onto existing
    /// capacity held in it (consolidation commits each decision it takes).
    compiled: Compiled,
    /// Nominated nodes: the options' and this pass's placement of pending pods.
    nominated: BTreeMap<String, Nomination>,
    /// Disruption budgets left, by pool.
    ledger: Ledger,
    /// Evictions each PodDisruptionBudget still allows.
    pdbs: PdbLedger,
    /// Candidates admitted without drawing on `pdbs` (their terminationGracePeriod bounds them).
    past_pdbs: BTreeSet<String>,
    /// The first rule that held each node (the protection ledger).
    blocked: BTreeMap<String, Held>,
    /// The candidate each evicted pod runs on.
    owner: BTreeMap<PodRef, &'a str>,
    /// Nodes chosen so far.
    removed: BTreeSet<String>,
    /// Chosen nodes that go whether or not their pods fit elsewhere (repair):
    /// what-ifs leave those pods to provisioning.
    forced: BTreeSet<String>,
    /// The last feasible solve with `removed` gone (none while nothing needed one).
    plan: Option<Plan>,
    /// How far consolidation got, once it ran.
    coverage: Option<Coverage>,
}

impl<'a> Pass<'a> {
    fn new(snapshot: &'a Snapshot, options: &'a DecideOptions, candidates: &'a [Candidate<'a>]) -> Self {
        let mut pool_counts: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for c in candidates {
            let e = pool_counts.entry(c.pool.name()).or_default();
            e.0 += 1;
            e.1 += usize::from(c.disrupting);
        }
        let ledger = Ledger::new(
            snapshot.now,
            snapshot.node_pools.iter().map(|p| {
                let (total, disrupting) = pool_counts.get(p.name()).copied().unwrap_or_default();
                (p, total, disrupting)
            }),
        );
        let pdbs = PdbLedger::new(&snapshot.pod_disruption_budgets, &snapshot.nodes);
        let mut compiled = snapshot.compile();
        // Recorded nominations keep room for pods still pending: once none is
        // (all bound, or gone), they hold nothing, whatever their expiry.
        let mut nominated = match snapshot.pods.is_empty() {
            true => BTreeMap::new(),
            false => options.nominated.clone(),
        };
        if !snapshot.pods.is_empty() {
            // This pass's placement names the pods pending now: it goes first.
            nominated.extend(nomination::place_pending(&mut compiled, options.deadline));
        }
        // Karpenter refuses a nominated node as a candidate before any method
        // looks at it, so every one is reported (forceful methods may still take it).
        let blocked = candidates
            .iter()
            .filter(|c| !c.disrupting)
            .filter_map(|c| Some((c.name.clone(), Held::Nominated(nominated.get(&c.name)?.clone()))))
            .collect();
        let owner = candidates
            .iter()
            .flat_map(|c| c.evicted().map(move |p| (PodRef::of(p), c.name.as_str())))
            .collect();
        Pass {
            cx: Context {
                now: snapshot.now,
                snapshot,
                options,
            },
            compiled,
            nominated,
            ledger,
            pdbs,
            past_pdbs: BTreeSet::new(),
            blocked,
            owner,
            removed: BTreeSet::new(),
            forced: BTreeSet::new(),
            plan: None,
            coverage: None,
        }
    }

    /// The candidates no method has taken yet, in name order.
    fn open<'p>(&'p self, candidates: &'a [Candidate<'a>]) -> impl Iterator<Item = &'a Candidate<'a>> + 'p {
        candidates
            .iter()
            .filter(|c| !c.disrupting && !self.removed.contains(&c.name))
    }

    /// Notes the rule that held `c`, unless an earlier one did.
    fn hold(&mut self, c: &Candidate, h: Held) {
        self.blocked.entry(c.name.clone()).or_insert(h);
    }

    /// Protections, budgets and PDBs for one candidate of `m`; on success the
    /// candidate holds its share of the budget and of the PDBs.
    fn admit<M: Method + ?Sized>(&mut self, m: &M, c: &Candidate) -> Result<(), Held> {
        let now = self.cx.now;
        // Karpenter's eventual methods (drift; expiry, forceful) with a
        // terminationGracePeriod: the drain ends by then whatever pods say.
        let bounded =
            self.cx.options.grace_period_bounds_eventual && m.eventual() && c.termination_grace_period().is_some();
        if !m.forceful() {
            if let Some(from) = &c.receiving_from {
                return Err(Held::Receiving { from: from.clone() });
            }
            if let Some(n) = self.nominated.get(&c.name) {
                return Err(Held::Nominated(n.clone()));
            }
            if c.do_not_disrupt(now) {
                return Err(Held::DoNotDisruptNode);
            }
            if !bounded && let Some(p) = c.do_not_disrupt_pod(now) {
                return Err(Held::DoNotDisruptPod(p));
            }
            if let Some(p) = c.uncontrolled_pod() {
                return Err(Held::NoController(p));
            }
        }
        self.ledger.take(c.pool.name(), m.reason()).map_err(|r| match r {
            Refusal::Exhausted { allowed } => Held::Budget {
                pool: c.pool.name().to_string(),
                reason: m.reason(),
                allowed,
            },
            Refusal::Invalid(e) => Held::InvalidBudget(e),
        })?;
        if bounded {
            // PDBs slow its drain until the deadline; they do not hold it.
            self.past_pdbs.insert(c.name.clone());
            return Ok(());
        }
        if let Err(r) = self.pdbs.take(c.evicted()) {
            self.ledger.give_back(c.pool.name());
            return Err(Held::Pdb { pdb: r.pdb, pod: r.pod });
        }
        Ok(())
    }

    /// Whether the pod runs on a node that goes whatever becomes of it.
    fn forced_pod(&self, pod: &PodRef) -> bool {
        self.owner.get(pod).is_some_and(|n| self.forced.contains(*n))
    }

    /// Undoes [`Pass::admit`].
    fn release(&mut self, c: &Candidate) {
        self.ledger.give_back(c.pool.name());
        if !self.past_pdbs.remove(&c.name) {
            self.pdbs.give_back(c.evicted());
        }
    }

    fn solve(&self, removed: &BTreeSet<String>) -> Plan {
        self.compiled.solve(&SolveOptions {
            removed: removed.clone(),
            deadline: self.cx.options.deadline,
            ..SolveOptions::default()
        })
    }

    /// The default selection: every open candidate `m` wants, in its order,
    /// admitted one at a time; then the batch is solved with every chosen node
    /// gone, dropping what cannot be placed until it fits.
    fn admit_each<M: Method + ?Sized>(&mut self, m: &M, candidates: &'a [Candidate<'a>]) -> Vec<&'a Candidate<'a>> {
        let mut order: Vec<&Candidate> = self.open(candidates).collect();
        order.sort_by(|a, b| m.order(a, b));
        let mut batch: Vec<&Candidate> = Vec::new();
        for c in order {
            match m.judge(c, &self.cx) {
                Verdict::Skip => continue,
                Verdict::Held(h) => {
                    self.hold(c, h);
                    continue;
                }
                Verdict::Disrupt => {}
            }
            if let Err(h) = self.admit(m, c) {
                self.hold(c, h);
                continue;
            }
            batch.push(c);
        }
        while !batch.is_empty() {
            // Earlier moves may have landed on this batch's nodes: solve again then too.
            let needs_solve = self.plan.is_some() || batch.iter().any(|c| !c.is_empty());
            let mut removed = self.removed.clone();
            removed.extend(batch.iter().map(|c| c.name.clone()));
            let plan = if needs_solve { Some(self.solve(&removed)) } else { None };
            // Pods of repaired nodes that fit nowhere wait for provisioning: they hold no one back.
            let stuck = plan.as_ref().and_then(|p| {
                p.unschedulable
                    .iter()
                    .find(|u| !self.forced_pod(&u.pod))
                    .map(|u| (p, u))
            });
            let Some((plan, first)) = stuck else {
                self.removed = removed;
                if plan.is_some() {
                    self.plan = plan;
                }
                break;
            };
            // Drop the batch's nodes whose pods are stuck; if the stuck pods
            // belong to nodes chosen before, drop the batch's last node.
            let stuck_nodes: BTreeMap<&str, (&PodRef, String)> = plan
                .unschedulable
                .iter()
                .filter(|u| !self.forced_pod(&u.pod))
                .filter_map(|u| self.owner.get(&u.pod).map(|n| (*n, (&u.pod, u.reason.to_string()))))
                .collect();
            let before = batch.len();
            let mut dropped: Vec<(&Candidate, Held)> = Vec::new();
            batch.retain(|c| match stuck_nodes.get(c.name.as_str()) {
                Some((pod, why)) => {
                    dropped.push((
                        c,
                        Held::CannotPlace {
                            pod: (*pod).clone(),
                            why: why.clone(),
                        },
                    ));
                    false
                }
                None => true,
            });
            if batch.len() == before
                && let Some(c) = batch.pop()
            {
                dropped.push((
                    c,
                    Held::CannotPlace {
                        pod: first.pod.clone(),
                        why: first.reason.to_string(),
                    },
                ));
            }
            for (c, h) in dropped {
                self.release(c);
                self.hold(c, h);
            }
        }
        batch
    }
}

/// Splits the pass's plan among its decisions: each move goes to the
/// decision that removed the pod's node, each replacement to the decision of
/// its first pod; prices and savings follow.
fn assemble(
    candidates: &[Candidate],
    chosen: Vec<(Reason, Vec<&Candidate>)>,
    blocked: BTreeMap<String, Held>,
    plan: Option<Plan>,
    errors: Vec<BudgetError>,
) -> Decisions {
    let mut reason_of: BTreeMap<&str, usize> = BTreeMap::new();
    let mut decisions: Vec<Command> = chosen
        .iter()
        .enumerate()
        .map(|(i, (reason, nodes))| {
            let mut names: Vec<String> = nodes.iter().map(|c| c.name.clone()).collect();
            names.sort();
            for c in nodes {
                reason_of.insert(c.name.as_str(), i);
            }
            Command {
                reason: *reason,
                nodes: names,
                replacements: Vec::new(),
                moves: Vec::new(),
                savings_per_hour: nodes.iter().filter_map(|c| c.price).sum(),
            }
        })
        .collect();
    let owner: BTreeMap<PodRef, usize> = chosen
        .iter()
        .flat_map(|(_, nodes)| nodes.iter())
        .flat_map(|c| c.evicted().map(|p| (PodRef::of(p), c.name.as_str())))
        .filter_map(|(p, n)| reason_of.get(n).map(|i| (p, *i)))
        .collect();
    if let Some(plan) = plan {
        for e in &plan.existing {
            for p in &e.pods {
                if let Some(i) = owner.get(p) {
                    decisions[*i].moves.push(Move {
                        pod: p.clone(),
                        to: e.name.clone(),
                    });
                }
            }
        }
        for claim in plan.node_claims {
            let mut pods = claim.pods.clone();
            pods.sort();
            let Some(i) = pods.iter().find_map(|p| owner.get(p)).copied() else {
                continue;
            };
            for p in &pods {
                if let Some(j) = owner.get(p) {
                    decisions[*j].moves.push(Move {
                        pod: p.clone(),
                        to: claim.name.clone(),
                    });
                }
            }
            decisions[i].savings_per_hour -= claim.price;
            decisions[i].replacements.push(claim);
        }
    }
    for d in &mut decisions {
        d.moves.sort();
        d.replacements.sort_by(|a, b| a.name.cmp(&b.name));
    }
    let price_before: f64 = candidates.iter().filter_map(|c| c.price).sum();
    let savings: f64 = decisions.iter().map(|d| d.savings_per_hour).sum();
    let chosen_names: BTreeSet<&str> = chosen
        .iter()
        .flat_map(|(_, n)| n.iter().map(|c| c.name.as_str()))
        .collect();
    Decisions {
        decisions,
        blocked: blocked
            .into_iter()
            .filter(|(n, _)| !chosen_names.contains(n.as_str()))
            .map(|(node, rule)| Blocked { node, rule })
            .collect(),
        errors,
        price_before,
        price_after: price_before - savings,
        nodes: BTreeMap::new(),
        consolidation: None,
    }
}

#[cfg(test)]
mod tests;
