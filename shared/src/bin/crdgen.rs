//! Prints the NodePool, EC2NodeClass and NodeClaim CRDs as YAML (see `infra/k8s/crds.yaml`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    print!("{}", nodesmith::kubernetes::crds::crds_yaml()?);
    Ok(())
}
