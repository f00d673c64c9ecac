//! Crash at every step: each function is made to die right after each of its
//! external writes (`nodesmith::crash`, debug builds), on the local cloud,
//! and the system must converge again within two sweeps more than the same
//! step takes without a crash: every pod running, no leaked instance, no
//! NodeClaim with two instances, nothing dead-lettered, and, in the phases
//! that crash the mirror's writes, kubectl's view (NodeClaim objects,
//! NodePool status) in step with the state table.
//!
//! The crash points are not listed by hand: a first run of each phase of the
//! story (provision, interruption, consolidation, drift, garbage collection)
//! logs every external call each function makes, and every write it logged
//! becomes a point (the call, and its occurrence within the invocation).
//! Dying after a read leaves what dying after the write before it leaves, so
//! only writes are distinct points. A static check holds the writes the
//! code can make (`nodesmith_tests::calls`) to those the runs reached. The
//! default level plays, in each phase, one point of every kind of write that
//! is the phase's own, of a seeded half of the other kinds it makes, and a
//! seeded rotation of more ([`chosen`]); `scripts/test --full` plays them all.
//!
//! The sweep runs only when the test says (one run = one sweep), so "within
//! two sweeps" is counted, not timed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nodesmith::crash::{Logged, Point};
use nodesmith_tests::eventbridge;
use nodesmith_tests::local_cloud::census::{self, Ledger, World, has_taint, pod_running};
use nodesmith_tests::local_cloud::demo::inflate;
use nodesmith_tests::local_cloud::{LocalCloud, Settings, default_objects};
use serde_json::json;

/// The functions, as their crash files name them.
const FUNCTIONS: [&str; 4] = ["provision", "launch", "interrupt", "sweep"];

/// One step of the story a crash can cut short.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Two more replicas: provision, launch, registration.
    Provision,
    /// A spot interruption warning for the busiest node, then EC2 takes it.
    Interrupt,
    /// Four replicas fewer: empty and underused nodes are consolidated.
    Consolidate,
    /// The EC2NodeClass changes: every node drifts and is replaced.
    Drift,
    /// Two instances tagged for the cluster that no NodeClaim names are collected.
    Collect,
}

/// The local cloud with the crash hook armed and the sweep run by hand.
struct Harness {
    cloud: LocalCloud,
    dir: PathBuf,
    ledger: Ledger,
    ec2: aws_sdk_ec2::Client,
    replicas: usize,
    drift: usize,
    ghosts: usize,
    /// The busiest node of the last interruption, and its instance.
    victim: Option<(String, String)>,
    /// What the last look saw.
    last: World,
    /// Sweeps a play runs at least, converged or not: one when the sweep is
    /// armed, since a play can converge before any sweep (provision joins
    /// nodes as they appear) and the point would then never be reached.
    min_sweeps: usize,
    /// Whether convergence includes kubectl's view ([`Harness::mirror_problems`]):
    /// in the phases that crash the mirror's writes ([`WRITES`]) only, since
    /// a play that waits for the mirror takes a sweep or two more.
    mirror_checked: bool,
}

/// Why a step did not converge.
type Problems = Vec<String>;

impl Harness {
    async fn start(name: &str) -> Harness {
        let dir = std::env::temp_dir().join(format!("nodesmith-crash-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut settings = Settings::from_lookup(|_| None, nodesmith_tests::bin_dir()).unwrap();
        settings.manual_sweep = true;
        settings.crash_dir = Some(dir.clone());
        // One process per function, so the armed point fires in the one
        // invocation that reaches it; a visibility timeout longer than any
        // invocation here, so no message is delivered twice by timing (a
        // crashed invocation's batch comes back at once instead).
        settings.single_process = true;
        settings.visibility_timeout = Duration::from_secs(10);
        // Plays count sweeps, not seconds: two phases share the machine.
        settings.alone = false;
        // Every wait of a real cluster short, as plays count sweeps, not seconds:
        // the forwarder's and the queue's batch windows, a kubelet's start.
        settings.batch_idle = Duration::from_millis(200);
        settings.batch_window = Duration::from_millis(200);
        settings.kubelet_join = Duration::from_millis(100);
        settings.kubelet_ready = Duration::from_millis(100);
        // `quiet` steps the kubelets before every look; their own loop,
        // a DescribeInstances each time, need not run four times a second.
        settings.kubelet_period = Duration::from_secs(1);
        settings.leak_grace = Duration::from_secs(3);
        // A claimless instance whose Node never registered is collected once
        // this has passed since its launch (the Collect phase's ghosts): short,
        // yet far longer than a node here takes to join (100 ms).
        settings.registration_timeout = Duration::from_secs(5);
        // A budget no sweep here spends: a sweep that ran out of it would
        // leave its steps to the next one, so the sweeps a play takes would
        // depend on the machine's load (a loaded run saw a cold sweep spend
        // a 3 s budget on its reads, and a play miss its count by one).
        settings.sweep_budget = Duration::from_secs(30);
        // Leases and the relaunch delay are shorter than the gap between two
        // sweeps here, as they are (15 s, 30 s) against the minute between sweeps in AWS.
        settings.lease = Duration::from_secs(1);
        settings.relaunch_after = Duration::from_secs(1);
        // One drain pass per interrupt invocation (the sweep goes on with it),
        // so an invocation ends well inside the queue's visibility timeout,
        // as its 100 s budget does inside 30 minutes in AWS.
        settings.interrupt_drain_budget = Duration::ZERO;
        settings.state_dir = Some(dir.join("state"));
        let cloud = LocalCloud::start(settings).await.unwrap();
        // Consolidation only where it is the phase's own work (at once there),
        // so the other phases take the same sweeps every time.
        let mut pool = default_objects(&cloud.settings.cluster, &cloud.world.node_role)[0].clone();
        let after = if name == "consolidate" { "0s" } else { "Never" };
        pool["spec"]["disruption"]["consolidateAfter"] = json!(after);
        cloud.kube.apply(&pool).unwrap();
        Harness {
            ec2: aws_sdk_ec2::Client::new(&cloud.sdk),
            cloud,
            dir,
            ledger: Ledger::default(),
            replicas: 0,
            drift: 0,
            ghosts: 0,
            victim: None,
            last: World::default(),
            min_sweeps: 0,
            mirror_checked: WRITES
                .iter()
                .any(|(call, p)| mirror_write(call) && p.is_ok_and(|p| format!("{p:?}").to_lowercase() == name)),
        }
    }

    async fn world(&mut self) -> World {
        let world = census::observe(&self.cloud, |a| a == "inflate").await.unwrap();
        self.ledger.note(&world);
        self.last = world.clone();
        world
    }

    /// What keeps the cloud from having converged (none: it has).
    async fn problems(&mut self, except_tainted: Option<&str>) -> Problems {
        let w = self.world().await;
        let mut p = Vec::new();
        let running = w.pods.iter().filter(|p| pod_running(p)).count();
        if w.pods.len() != self.replicas || running != self.replicas {
            p.push(format!(
                "{running} of {} pods running ({} pods)",
                self.replicas,
                w.pods.len()
            ));
        }
        let leaked = w.leaked();
        if !leaked.is_empty() {
            p.push(format!("leaked instances {leaked:?}"));
        }
        let doubles = self.ledger.double_launches();
        if !doubles.is_empty() {
            p.push(format!("NodeClaims with two instances {doubles:?}"));
        }
        for n in &w.nodes {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            if has_taint(n, "karpenter.sh/disrupted") && Some(name) != except_tainted {
                p.push(format!("node {name} is still tainted karpenter.sh/disrupted"));
            }
            if !census::node_ready(n) {
                p.push(format!("node {name} is not Ready"));
            }
        }
        let bound: BTreeSet<&str> = w.claims.iter().filter_map(|c| c.node_name.as_deref()).collect();
        let nodes: BTreeSet<&str> = w.nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
        for c in &w.claims {
            match c.node_name.as_deref() {
                None => p.push(format!(
                    "claim {} ({:?}, instance {:?}) has no node",
                    c.name, c.phase, c.instance_id
                )),
                Some(n) if !nodes.contains(n) => {
                    p.push(format!("claim {} ({:?}): its node {n} is gone", c.name, c.phase))
                }
                Some(_) => {}
            }
        }
        for n in &w.nodes {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            if !bound.contains(name) {
                let provider = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .unwrap_or_default();
                p.push(format!("node {name} ({provider}) belongs to no claim"));
            }
        }
        let cloud = &self.cloud.world;
        for dlq in [
            &cloud.pending.dlq_url,
            &cloud.launch.dlq_url,
            &cloud.interruption.dlq_url,
        ] {
            let n = self.cloud.queued(dlq).await.unwrap();
            if n > 0 {
                p.push(format!("{n} messages dead-lettered in {dlq}"));
            }
        }
        // Settled in the table and (where its writes are crashed) in
        // kubectl's view too: a disruption, drain or termination still
        // recorded is work a crash left, which would otherwise run into the
        // next play and count against its sweeps. While an interrupted node
        // waits for EC2, its drain is allowed.
        if except_tainted.is_none() {
            p.extend(self.records_in_progress().await);
            if self.mirror_checked {
                p.extend(self.mirror_problems(&w).await);
            }
        }
        p
    }

    /// What kubectl would show wrong: a claim without its NodeClaim object
    /// (or one naming another node), an object that outlived its claim, a
    /// NodePool status counting other than the claims' nodes.
    async fn mirror_problems(&self, w: &World) -> Problems {
        use kube::api::{Api, ListParams};
        use nodesmith::apis::nodeclaim::NodeClaimObject;
        let client = self.cloud.kube.client();
        let objects = Api::<NodeClaimObject>::all(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let by_name: BTreeMap<String, Option<String>> = objects
            .iter()
            .filter_map(|o| {
                let node = o.status.as_ref().and_then(|s| s.node_name.clone());
                Some((o.metadata.name.clone()?, node))
            })
            .collect();
        let mut p = Vec::new();
        for c in &w.claims {
            match by_name.get(&c.name) {
                None => p.push(format!("claim {} has no NodeClaim object", c.name)),
                Some(node) if node != &c.node_name => p.push(format!(
                    "the NodeClaim object {} names node {node:?}, its claim {:?}",
                    c.name, c.node_name
                )),
                Some(_) => {}
            }
        }
        let claims = w.claim_names();
        for name in by_name.keys().filter(|n| !claims.contains(*n)) {
            p.push(format!("the NodeClaim object {name} outlived its claim"));
        }
        let pool = Api::<nodesmith::apis::NodePool>::all(client)
            .get("default")
            .await
            .unwrap();
        let counted = pool.status.and_then(|s| s.nodes);
        let nodes = w.claims.iter().filter(|c| c.node_name.is_some()).count() as i64;
        if counted != Some(nodes) {
            p.push(format!(
                "NodePool default's status counts {counted:?} nodes, the claims have {nodes}"
            ));
        }
        p
    }

    /// The disruptions, drains and terminations the state table still records.
    async fn records_in_progress(&self) -> Problems {
        let store = nodesmith::state::StateStore::new(
            aws_sdk_dynamodb::Client::new(&self.cloud.sdk),
            nodesmith_tests::local_cloud::aws::TABLE,
        );
        let mut p = Vec::new();
        let disruptions: Vec<String> = store.disruptions().await.unwrap().into_iter().map(|r| r.node).collect();
        if !disruptions.is_empty() {
            p.push(format!("disruptions still recorded for {disruptions:?}"));
        }
        let drains: Vec<String> = store.drains().await.unwrap().into_iter().map(|r| r.claim).collect();
        if !drains.is_empty() {
            p.push(format!("drains still recorded for claims {drains:?}"));
        }
        let terminations: Vec<String> = store
            .terminations()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.claim)
            .collect();
        if !terminations.is_empty() {
            p.push(format!("terminations still recorded for claims {terminations:?}"));
        }
        p
    }

    /// Sweeps until converged and `goal` holds (it names what is missing);
    /// how many sweeps it took, or what was still wrong after `limit`.
    async fn settle_for(
        &mut self,
        limit: usize,
        except_tainted: Option<&str>,
        goal: impl Fn(&World) -> Option<String>,
    ) -> Result<usize, (usize, Problems)> {
        let mut sweeps = 0;
        let mut swept: Option<tokio::time::Instant> = None;
        loop {
            self.cloud.quiet(Duration::from_secs(90)).await;
            let mut problems = self.problems(except_tainted).await;
            problems.extend(goal(&self.last));
            if problems.is_empty() && sweeps >= self.min_sweeps {
                return Ok(sweeps);
            }
            if sweeps >= limit {
                return Err((sweeps, problems));
            }
            // As the minute between sweeps does in AWS, the gap outlasts the
            // leases (a crashed sweep's lapses, it is not given back) and the
            // relaunch delay, so each sweep can do the next step.
            if let Some(at) = swept {
                tokio::time::sleep_until(at + self.sweep_gap()).await;
            }
            if let Err(e) = self.cloud.sweep().await.map(|a| a.result) {
                eprintln!("the sweep could not be invoked: {e}");
            }
            swept = Some(tokio::time::Instant::now());
            sweeps += 1;
        }
    }

    /// The least time from one sweep's end to the next one's start.
    fn sweep_gap(&self) -> Duration {
        let s = &self.cloud.settings;
        s.lease.max(s.relaunch_after) + Duration::from_millis(300)
    }

    async fn settle(&mut self, limit: usize, except_tainted: Option<&str>) -> Result<usize, (usize, Problems)> {
        self.settle_for(limit, except_tainted, |_| None).await
    }

    /// The last look, for a failure's message: claims, nodes, pods.
    fn describe(&self) -> String {
        let w = &self.last;
        let mut out = String::new();
        for c in &w.claims {
            out.push_str(&format!(
                "claim {} {:?} node {:?} instance {:?}\n",
                c.name, c.phase, c.node_name, c.instance_id
            ));
        }
        for n in &w.nodes {
            let taints: Vec<String> = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .map(|t| t.key.clone())
                .collect();
            out.push_str(&format!(
                "node {:?} ready {} taints {taints:?}\n",
                n.metadata.name,
                census::node_ready(n)
            ));
        }
        for p in &w.pods {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let phase = p.status.as_ref().and_then(|s| s.phase.clone());
            out.push_str(&format!("pod {:?} on {node:?} {phase:?}\n", p.metadata.name));
        }
        for i in &w.instances {
            out.push_str(&format!("instance {} {} claim {:?}\n", i.id, i.state, i.claim));
        }
        out
    }

    fn file(&self, function: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{function}.{ext}"))
    }

    fn arm(&self, function: &str, point: &Point) {
        std::fs::write(self.file(function, "point"), serde_json::to_string(point).unwrap()).unwrap();
    }

    /// Disarms every function; the point that fired, if one did.
    fn disarm(&self) -> Option<(String, Logged)> {
        let mut fired = None;
        for f in FUNCTIONS {
            let _ = std::fs::remove_file(self.file(f, "point"));
            if let Ok(text) = std::fs::read_to_string(self.file(f, "fired")) {
                let _ = std::fs::remove_file(self.file(f, "fired"));
                fired = serde_json::from_str(&text).ok().map(|l| (f.to_string(), l));
            }
        }
        fired
    }

    /// Every call logged since the last take, per function.
    fn take_calls(&self) -> BTreeMap<String, Vec<Logged>> {
        let mut all = BTreeMap::new();
        for f in FUNCTIONS {
            let path = self.file(f, "calls");
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let _ = std::fs::write(&path, "");
            let calls: Vec<Logged> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
            all.insert(f.to_string(), calls);
        }
        all
    }

    async fn scale(&mut self, replicas: usize) {
        self.replicas = replicas;
        self.cloud.kube.apply(&inflate(replicas)).unwrap();
    }

    /// Gets the phase's starting state ready (nothing armed yet).
    async fn setup(&mut self, phase: Phase) {
        match phase {
            Phase::Consolidate => {
                self.scale(self.replicas + 4).await;
                self.settle(8, None)
                    .await
                    .unwrap_or_else(|e| panic!("setup of {phase:?}: {e:?}"));
            }
            Phase::Interrupt => {
                // The busiest spot node with at least two pods (so a crash can land mid-drain).
                let w = self.world().await;
                let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
                for p in &w.pods {
                    if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                        *per_node.entry(n).or_default() += 1;
                    }
                }
                let victim = w
                    .claims
                    .iter()
                    .filter(|c| c.node_name.is_some() && c.instance_id.is_some())
                    .max_by_key(|c| {
                        per_node
                            .get(c.node_name.as_deref().unwrap_or_default())
                            .copied()
                            .unwrap_or(0)
                    })
                    .map(|c| (c.node_name.clone().unwrap(), c.instance_id.clone().unwrap()));
                self.victim = victim;
            }
            _ => {}
        }
    }

    /// Plays the phase and settles it; the sweeps it took.
    async fn play(&mut self, phase: Phase, extra: usize, baseline: usize) -> Result<usize, (usize, Problems)> {
        let limit = baseline + extra;
        // Every play starts cold, as a crashed one goes on: a warm process
        // remembers the events it wrote for a while and does not repeat
        // them, so whether a play writes one would depend on how long ago
        // the play before it did (CI saw "sweep, kube:create events" never
        // fire that way).
        self.cloud.recycle().await;
        match phase {
            Phase::Provision => {
                self.scale(self.replicas + 2).await;
                self.settle(limit, None).await
            }
            Phase::Consolidate => {
                self.scale(self.replicas - 4).await;
                self.settle_for(limit, None, |w| {
                    let empty = w.empty_nodes();
                    (!empty.is_empty()).then(|| format!("empty nodes {empty:?} not consolidated"))
                })
                .await
            }
            Phase::Drift => {
                let before = self.world().await.claim_names();
                self.drift += 1;
                let mut class = default_objects(&self.cloud.settings.cluster, &self.cloud.world.node_role)[1].clone();
                class["spec"]["tags"] = json!({"nodesmith.dev/crash": self.drift.to_string()});
                self.cloud.kube.apply(&class).unwrap();
                self.settle_for(limit, None, |w| {
                    let left: Vec<String> = w.claim_names().intersection(&before).cloned().collect();
                    (!left.is_empty()).then(|| format!("drifted claims {left:?} not replaced"))
                })
                .await
            }
            Phase::Interrupt => {
                let (node, instance) = self.victim.clone().expect("a node to interrupt");
                let eb = aws_sdk_eventbridge::Client::new(&self.cloud.sdk);
                eventbridge::put_spot_warning(&eb, &instance).await.unwrap();
                // Until EC2 takes it, the warned node keeps its taint; its pods must have moved.
                // The play's least sweeps are counted after EC2 takes it: a sweep
                // forced here would end the drained node itself, before EC2 does.
                let min_sweeps = std::mem::take(&mut self.min_sweeps);
                let first = self.settle(limit, Some(&node)).await;
                self.min_sweeps = min_sweeps;
                let first = first?;
                let w = self.world().await;
                let left = w
                    .pods
                    .iter()
                    .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()))
                    .count();
                if left > 0 {
                    return Err((first, vec![format!("{left} pods still on the interrupted node {node}")]));
                }
                self.ec2
                    .terminate_instances()
                    .instance_ids(&instance)
                    .send()
                    .await
                    .unwrap();
                let second = self
                    .settle(limit.saturating_sub(first), None)
                    .await
                    .map_err(|(n, p)| (first + n, p))?;
                Ok(first + second)
            }
            Phase::Collect => {
                // In one launch: ghosts launched apart could pass their grace
                // in different sweeps, and then the collection cap, and its
                // event, would not be reached in every play.
                let claims: Vec<String> = (0..2)
                    .map(|_| {
                        self.ghosts += 1;
                        format!("default-ghost{}", self.ghosts)
                    })
                    .collect();
                self.leak(&claims).await;
                self.settle(limit, None).await
            }
        }
    }

    /// Instances tagged as nodesmith launches them, one per NodeClaim named,
    /// none of which exists.
    async fn leak(&self, claims: &[String]) {
        let cluster = &self.cloud.settings.cluster;
        let tag_sets: Vec<Vec<(String, String)>> = claims
            .iter()
            .map(|claim| {
                vec![
                    (format!("kubernetes.io/cluster/{cluster}"), "owned".to_string()),
                    ("nodesmith/launched-by".to_string(), cluster.clone()),
                    ("karpenter.sh/nodepool".to_string(), "default".to_string()),
                    ("karpenter.sh/nodeclaim".to_string(), claim.clone()),
                ]
            })
            .collect();
        nodesmith_tests::moto::run_tagged_instances(&self.ec2, &tag_sets).await;
    }
}

/// Every kind of write the code makes (as `nodesmith::crash` names calls),
/// and the phase whose test crashes right after it; `Err`: why no phase
/// plays it on the local cloud. A static test holds this list to the code's
/// calls, so a new kind of write fails until a phase crashes after it.
const WRITES: &[(&str, Result<Phase, &str>)] = &[
    ("dynamodb:PutItem", Ok(Phase::Provision)),
    ("dynamodb:UpdateItem", Ok(Phase::Provision)),
    ("dynamodb:DeleteItem", Ok(Phase::Provision)),
    ("dynamodb:TransactWriteItems", Ok(Phase::Provision)),
    ("dynamodb:BatchWriteItem", Ok(Phase::Interrupt)),
    (
        "dynamodb:CreateTable",
        Err("only scripts/dev-stack and the tests make the table; in AWS the stack does"),
    ),
    ("sqs:SendMessageBatch", Ok(Phase::Provision)),
    ("sqs:SendMessage", Ok(Phase::Interrupt)),
    (
        "sqs:ChangeMessageVisibility",
        Err(
            "only when an interruption event fails (no phase fails one); the interruption test of a failed event covers it",
        ),
    ),
    ("ec2:CreateFleet", Ok(Phase::Provision)),
    ("ec2:CreateLaunchTemplate", Ok(Phase::Provision)),
    ("ec2:TerminateInstances", Ok(Phase::Collect)),
    (
        "ec2:DeleteLaunchTemplate",
        Err(
            "templates are collected 10 minutes after their class moved on (TEMPLATE_GRACE); launch_moto and the gc table test cover the collection",
        ),
    ),
    (
        "iam:CreateInstanceProfile",
        Err(
            "made once per class role, at its first launch (before any phase here); launch_profiles covers a retry that finds it",
        ),
    ),
    (
        "iam:AddRoleToInstanceProfile",
        Err("as CreateInstanceProfile: once per class role, at its first launch"),
    ),
    (
        "iam:RemoveRoleFromInstanceProfile",
        Err("only when a class is deleted or changes its role; launch_profiles covers it"),
    ),
    (
        "iam:DeleteInstanceProfile",
        Err("only when a class is deleted or changes its role; launch_profiles covers it"),
    ),
    ("kube:patch nodes", Ok(Phase::Provision)),
    ("kube:delete nodes", Ok(Phase::Consolidate)),
    (
        "kube:delete pods",
        Err("only at an interruption's deadline, for pods a PDB still holds; the interruption tests cover it"),
    ),
    ("kube:create pods/eviction", Ok(Phase::Interrupt)),
    ("kube:create events", Ok(Phase::Provision)),
    ("kube:update ec2nodeclasses/status", Ok(Phase::Drift)),
    // The mirror (`nodesmith::mirror`): played only in these phases, see [`mirror_write`].
    ("kube:create nodeclaims", Ok(Phase::Provision)),
    ("kube:update nodeclaims/status", Ok(Phase::Provision)),
    ("kube:update nodepools/status", Ok(Phase::Provision)),
    ("kube:update nodeclaims", Ok(Phase::Consolidate)),
    ("kube:delete nodeclaims", Ok(Phase::Consolidate)),
];

/// Whether `call` is one of the mirror's writes (NodeClaim objects,
/// NodePool status). Nothing else reads them but the termination a deleted
/// NodeClaim object begins, and every sweep rewrites them from the state
/// table, so a crash after one leaves what a crash after the write before it
/// leaves, but for the mirror itself (which [`Harness::mirror_problems`]
/// holds to convergence). They are played once each (first occurrence), in
/// the phase [`WRITES`] names, where they are the phase's own: not again in
/// every phase, which would cost the suite minutes and find nothing new.
fn mirror_write(call: &str) -> bool {
    call.ends_with(" nodeclaims") || call.ends_with(" nodeclaims/status") || call == "kube:update nodepools/status"
}

/// The phase [`WRITES`] crashes `call` in, if it does.
fn written_in(call: &str) -> Option<Phase> {
    WRITES.iter().find(|(c, _)| *c == call).and_then(|(_, p)| p.ok())
}

/// Crash points past the second occurrence of a call in one invocation
/// repeat the second's state on another item; they are not played.
const MAX_OCCURRENCE: u32 = 2;

/// How many sweeps more than without a crash a phase may take.
const EXTRA_SWEEPS: usize = 2;

/// Further crash points a default-level run plays per phase, beyond its
/// kinds of write: a different one each run, chosen by its seed (one, not
/// three, since the mirror's writes added five kinds: the suite's minutes in
/// CI are counted; `--full` plays every point).
const ROTATION: usize = 1;

/// Of the kinds of write a phase makes that are another phase's own
/// ([`WRITES`]), the share a default-level run plays, chosen by its seed: a
/// kind is then crashed after in a given phase once in two runs, and in its
/// own phase in every run (the suite's 25 minutes in CI could not hold every
/// kind in every phase; `--full` plays every point).
const OTHER_KINDS: (usize, usize) = (1, 2);

/// The variable that fixes the seed of the rotation (`scripts/test` prints
/// the seed it chose; set this to it to play the same points again).
const SEED_ENV: &str = "NODESMITH_CRASH_SEED";

/// This run's seed: [`SEED_ENV`], else taken from the clock.
fn seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={v:?} is not a whole number")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    }
}

/// splitmix64: a small, well-mixed sequence from one seed.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The points a run plays out of those a phase reached: at the full level
/// all of them; by default the first of every kind of write (call) that is
/// the phase's `own`, whichever function made it, the first of a seeded
/// share ([`OTHER_KINDS`]) of the other kinds, and [`ROTATION`] more drawn
/// with `seed` from the rest.
fn chosen(
    reached: &BTreeSet<(String, Point)>,
    own: impl Fn(&str) -> bool,
    full: bool,
    seed: u64,
) -> Vec<(String, Point)> {
    if full {
        return reached.iter().cloned().collect();
    }
    let mut kinds: BTreeSet<&str> = BTreeSet::new();
    let (mut picked, mut others, mut rest): (Vec<_>, Vec<_>, Vec<_>) = (Vec::new(), Vec::new(), Vec::new());
    for p in reached {
        if !kinds.insert(p.1.call.as_str()) {
            rest.push(p.clone());
        } else if own(&p.1.call) {
            picked.push(p.clone());
        } else {
            others.push(p.clone());
        }
    }
    let mut state = seed;
    let (share, of) = OTHER_KINDS;
    for _ in 0..(others.len() * share).div_ceil(of) {
        let i = (next_random(&mut state) % others.len() as u64) as usize;
        picked.push(others.swap_remove(i));
    }
    rest.extend(others);
    for _ in 0..ROTATION.min(rest.len()) {
        let i = (next_random(&mut state) % rest.len() as u64) as usize;
        picked.push(rest.swap_remove(i));
    }
    picked
}

/// Plays of a chosen point before it counts as never reached. Whether a
/// write is made can still race (the sweep or provision, whichever sees a
/// joining node first, registers it); a second play makes such a miss as
/// rare as two in a row, and every play must converge either way.
const PLAYS_PER_POINT: usize = 2;

/// Crash-free plays at most, when two do not agree on the phase's own writes.
const BASELINE_PLAYS: usize = 3;

/// Whether `function` makes `call` in `phase` when the wall clock says so,
/// not because of what the phase did. Crash-free plays can make such a write
/// and an armed play not (seen as "the point never fired"), so it is not a
/// crash point there; the phases where it is the phase's own still crash
/// after it.
fn time_driven(function: &str, call: &str, phase: Phase) -> bool {
    match (function, call) {
        // A solve once a pod has waited longer than the batch window since
        // the last one; in the Interrupt phase it is the "instance gone" solve.
        ("sweep", "sqs:SendMessage") => phase != Phase::Interrupt,
        // DisruptionBlocked on a node a pending pod is nominated to: written
        // only when a sweep runs before the pod binds (the Consolidate and
        // Drift phases crash after the sweep's own events).
        ("sweep", "kube:create events") => phase == Phase::Provision,
        _ => false,
    }
}

/// Whether the `occurrence`th `call` in one invocation depends on how fast
/// drains run rather than on the phase: a sweep terminates (and deletes the
/// Nodes of) every node whose drain has finished, so two consolidated nodes
/// are terminated in one sweep when both drains finish before it, and in two
/// when not. A second occurrence reached by the crash-free plays may then
/// never come in an armed one; the first stays a crash point.
fn drain_paced(call: &str, occurrence: u32) -> bool {
    occurrence > 1 && matches!(call, "ec2:TerminateInstances" | "kube:delete nodes")
}

/// The writes each function logged, as crash points. `provision` and
/// `launch` do the same whatever the phase, so they are played in the
/// phases where their work is the phase's own (provisioning, interruption
/// replacements); the sweep in every phase, but for its [`time_driven`]
/// writes.
fn points(phase: Phase, calls: &BTreeMap<String, Vec<Logged>>) -> BTreeSet<(String, Point)> {
    let played = |f: &str| match f {
        "provision" | "launch" => phase == Phase::Provision,
        "interrupt" => phase == Phase::Interrupt,
        _ => true,
    };
    calls
        .iter()
        .filter(|(f, _)| played(f))
        .flat_map(|(f, logged)| {
            logged
                .iter()
                .filter(move |l| l.write && l.occurrence <= MAX_OCCURRENCE && !time_driven(f, &l.call, phase))
                .filter(|l| !drain_paced(&l.call, l.occurrence))
                .filter(move |l| !mirror_write(&l.call) || (l.occurrence == 1 && written_in(&l.call) == Some(phase)))
                .map(move |l| {
                    (
                        f.clone(),
                        Point {
                            call: l.call.clone(),
                            occurrence: l.occurrence,
                        },
                    )
                })
        })
        .collect()
}

/// Plays `phase` once without a crash, then once per chosen crash point
/// ([`chosen`]), crashing there; every chosen point must fire and every play
/// converge within [`EXTRA_SWEEPS`] sweeps more than the crash-free one took.
/// Returns the (function, call) pairs crashed after.
async fn crash_through(phase: Phase) -> BTreeSet<(String, String)> {
    let full = nodesmith_tests::full_level();
    let seed = seed();
    let mut h = Harness::start(&format!("{phase:?}").to_lowercase()).await;
    h.scale(3).await;
    h.settle(8, None)
        .await
        .unwrap_or_else(|e| panic!("the first pods: {e:?}"));
    h.setup(phase).await;
    h.take_calls();
    // Twice at least: only the writes two crash-free plays made are the
    // phase's own (a first play also makes one-time writes, which an armed
    // play would not reach); the crash-free sweeps are the most of them. A
    // play that made none of one of the phase's own kinds of write (its pods
    // fitted capacity left over, say) is outvoted by one more play.
    let mut baseline = 0;
    let mut plays: Vec<BTreeSet<(String, Point)>> = Vec::new();
    let reached = loop {
        let sweeps = h
            .play(phase, 0, 8)
            .await
            .unwrap_or_else(|e| panic!("{phase:?} without a crash: {e:?}"));
        baseline = baseline.max(sweeps);
        plays.push(points(phase, &h.take_calls()));
        h.setup(phase).await;
        h.take_calls();
        if plays.len() < 2 {
            continue;
        }
        let twice: BTreeSet<(String, Point)> = plays
            .iter()
            .flatten()
            .filter(|p| plays.iter().filter(|these| these.contains(*p)).count() >= 2)
            .cloned()
            .collect();
        let missing: Vec<&str> = WRITES
            .iter()
            .filter(|(call, p)| *p == Ok(phase) && !twice.iter().any(|(_, point)| point.call == *call))
            .map(|(call, _)| *call)
            .collect();
        if missing.is_empty() || plays.len() >= BASELINE_PLAYS {
            break twice;
        }
        eprintln!("{phase:?}: a crash-free play made no {missing:?}; playing it once more");
    };
    let playing = chosen(&reached, |call| written_in(call) == Some(phase), full, seed);
    eprintln!(
        "{phase:?}: {baseline} sweeps without a crash; {} of {} crash points ({}; {SEED_ENV}={seed})",
        playing.len(),
        reached.len(),
        if full {
            "full level"
        } else {
            "the phase's own kinds of write, a seeded share of the others and a rotation"
        }
    );
    let mut crashed = BTreeSet::new();
    for (function, point) in &playing {
        let what = format!(
            "{phase:?}, {function} crashing after {} #{} ({SEED_ENV}={seed})",
            point.call, point.occurrence
        );
        let mut fired = None;
        for play in 1..=PLAYS_PER_POINT {
            h.arm(function, point);
            h.min_sweeps = usize::from(function == "sweep");
            let started = Instant::now();
            let result = h.play(phase, EXTRA_SWEEPS, baseline.max(h.min_sweeps)).await;
            h.min_sweeps = 0;
            fired = h.disarm();
            match &result {
                Ok(sweeps) => eprintln!(
                    "{what}: fired {}, converged after {sweeps} sweeps in {:.1} s",
                    fired.is_some(),
                    started.elapsed().as_secs_f64()
                ),
                Err((sweeps, problems)) => panic!(
                    "{what}: not converged after {sweeps} sweeps (crash-free: {baseline}); fired: {fired:?}\n{problems:#?}\n{}\nlogs: {}",
                    h.describe(),
                    h.cloud.log_dir().display()
                ),
            }
            if fired.as_ref().is_some_and(|(f, _)| f == function) {
                break;
            }
            if play < PLAYS_PER_POINT {
                eprintln!("{what}: not reached in play {play}; playing it again");
                h.setup(phase).await;
            }
        }
        assert!(
            fired.as_ref().is_some_and(|(f, _)| f == function),
            "{what}: the point never fired in {PLAYS_PER_POINT} plays (fired: {fired:?}); logs: {}",
            h.cloud.log_dir().display()
        );
        h.setup(phase).await;
        crashed.insert((function.clone(), point.call.clone()));
    }
    for (call, _) in WRITES.iter().filter(|(_, p)| *p == Ok(phase)) {
        assert!(
            crashed.iter().any(|(_, c)| c == call),
            "{phase:?} never crashed right after {call}: {crashed:?}"
        );
    }
    h.cloud.stop().await;
    let _ = std::fs::remove_dir_all(&h.dir);
    crashed
}

#[tokio::test(flavor = "multi_thread")]
async fn crashes_while_provisioning_converge() {
    crash_through(Phase::Provision).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crashes_while_answering_an_interruption_converge() {
    crash_through(Phase::Interrupt).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crashes_while_consolidating_converge() {
    crash_through(Phase::Consolidate).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crashes_while_replacing_drifted_nodes_converge() {
    crash_through(Phase::Drift).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crashes_while_collecting_leaked_instances_converge() {
    crash_through(Phase::Collect).await;
}

#[test]
fn every_kind_of_write_the_code_makes_is_crashed_after_or_says_why_not() {
    let mut code: BTreeSet<String> = nodesmith_tests::calls::sdk_calls()
        .into_iter()
        .map(|(op, _)| op)
        .filter(|op| {
            let (service, operation) = op.split_once(':').unwrap();
            nodesmith::crash::aws_call(service, operation).write
        })
        .collect();
    code.extend(nodesmith_tests::calls::kube_writes());
    // The scan must see what it exists for.
    for known in [
        "ec2:CreateFleet",
        "dynamodb:TransactWriteItems",
        "kube:create pods/eviction",
    ] {
        assert!(code.contains(known), "{known} not found: {code:?}");
    }
    let listed: BTreeSet<String> = WRITES.iter().map(|(c, _)| c.to_string()).collect();
    assert_eq!(listed.len(), WRITES.len(), "a write listed twice");
    let new: Vec<&String> = code.difference(&listed).collect();
    let gone: Vec<&String> = listed.difference(&code).collect();
    assert!(
        new.is_empty(),
        "writes no crash test covers: add them to WRITES with a phase: {new:?}"
    );
    assert!(
        gone.is_empty(),
        "WRITES lists writes the code no longer makes: {gone:?}"
    );
}

#[test]
fn a_default_run_crashes_after_the_phases_own_writes_a_seeded_half_of_the_others_and_a_rotation() {
    let p = |f: &str, call: &str, occurrence: u32| {
        (
            f.to_string(),
            Point {
                call: call.to_string(),
                occurrence,
            },
        )
    };
    let reached: BTreeSet<(String, Point)> = [
        p("provision", "dynamodb:TransactWriteItems", 1),
        p("provision", "dynamodb:TransactWriteItems", 2),
        p("provision", "sqs:SendMessageBatch", 1),
        p("launch", "ec2:CreateFleet", 1),
        p("launch", "dynamodb:UpdateItem", 1),
        p("launch", "dynamodb:UpdateItem", 2),
        p("sweep", "dynamodb:UpdateItem", 1),
        p("sweep", "kube:patch nodes", 1),
        p("sweep", "kube:patch nodes", 2),
        p("sweep", "kube:create events", 1),
    ]
    .into();
    let own = |call: &str| matches!(call, "dynamodb:TransactWriteItems" | "ec2:CreateFleet");
    assert_eq!(
        chosen(&reached, own, true, 7).len(),
        reached.len(),
        "the full level plays every point"
    );
    let kinds: BTreeSet<&str> = reached.iter().map(|(_, p)| p.call.as_str()).collect();
    let others: BTreeSet<&str> = kinds.iter().copied().filter(|k| !own(k)).collect();
    let half = others.len().div_ceil(2);
    let mut ever: BTreeSet<String> = BTreeSet::new();
    for seed in 0..50 {
        let picked = chosen(&reached, own, false, seed);
        let covered: BTreeSet<&str> = picked.iter().map(|(_, p)| p.call.as_str()).collect();
        assert!(
            kinds.iter().filter(|k| own(k)).all(|k| covered.contains(k)),
            "seed {seed}: every kind of the phase's own: {picked:?}"
        );
        let of_others = covered.iter().filter(|k| !own(k)).count();
        assert!(
            (half..=half + ROTATION).contains(&of_others),
            "seed {seed}: half of the other kinds: {picked:?}"
        );
        assert_eq!(picked.len(), 2 + half + ROTATION, "seed {seed}: {picked:?}");
        let distinct: BTreeSet<_> = picked.iter().collect();
        assert_eq!(distinct.len(), picked.len(), "seed {seed}: a point twice");
        assert!(picked.iter().all(|p| reached.contains(p)));
        assert_eq!(
            picked,
            chosen(&reached, own, false, seed),
            "the seed reproduces the choice"
        );
        ever.extend(covered.iter().map(|k| k.to_string()));
    }
    assert!(
        kinds.iter().all(|k| ever.contains(*k)),
        "some kind of write is never crashed after, whatever the seed: {ever:?}"
    );
    let rotations: BTreeSet<Vec<(String, Point)>> = (0..50).map(|s| chosen(&reached, own, false, s)).collect();
    assert!(rotations.len() > 1, "the rotation never changes with the seed");
}
