//! The functions on the local stack (moto, the Kubernetes API test server,
//! strict kubelets): provision, launch, interrupt and sweep as handlers and
//! as binaries under a local Lambda Runtime API, and the whole provisioning loop.

mod launch_fixtures;
mod local_stack;

mod adoption;
mod end_to_end;
mod interrupt_eventbridge;
mod interruption;
mod joining;
mod launch_runtime;
mod lifecycle;
mod nodeclaims;
mod provision;
mod provision_runtime;
mod region_prices;
mod static_capacity;
mod sweep_disruption;
mod sweep_node_class_status;
mod sweep_nomination;
mod sweep_protections;
mod sweep_repair;
mod sweep_reservation_end;
mod sweep_runtime;
mod termination;
