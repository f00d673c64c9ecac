//! Prints the NodePool and EC2NodeClass CRDs as YAML (see `infra/k8s/crds.yaml`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    print!("{}", nodesmith::kubernetes::crds::crds_yaml()?);
    Ok(())
}
