//! `nodesmith install`: the in-cluster part (namespace, forwarder, the
//! functions' RBAC) with what the stack knows filled in, so nothing in
//! `infra/k8s` is edited by hand: the pending-pods queue in the forwarder's
//! ConfigMap, the forwarder's image, and the IRSA annotation when the stack
//! was deployed for IRSA. The CRDs are printed apart (`--crds`), so that
//! deleting what `install` applied never deletes them, and with them every
//! NodePool. [`manifests`] is pure; [`describe_stack`] reads the stack.

use std::collections::BTreeMap;

use serde_json::Value;

/// The in-cluster manifests, as the repository has them.
const NAMESPACE: &str = include_str!("../../infra/k8s/namespace.yaml");
const FORWARDER: &str = include_str!("../../infra/k8s/forwarder.yaml");
const LAMBDA_RBAC: &str = include_str!("../../infra/k8s/lambda-rbac.yaml");
/// The CRDs (`nodesmith install --crds`), apart from the rest.
pub const CRDS: &str = include_str!("../../infra/k8s/crds.yaml");

/// The stack output that names the pending-pods queue.
pub const QUEUE_OUTPUT: &str = "PendingPodsQueueUrl";
/// The stack output that names the state table.
pub const TABLE_OUTPUT: &str = "StateTableName";
/// The stack output with the forwarder's IRSA annotation.
const IRSA_OUTPUT: &str = "ForwarderIrsaAnnotation";
/// The parameter that, set, makes the forwarder use IRSA instead of Pod Identity.
const IRSA_PARAMETER: &str = "ForwarderOidcProvider";

/// What `install` and `--stack` read of a CloudFormation stack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stack {
    /// The stack's name.
    pub name: String,
    /// Its outputs, by key.
    pub outputs: BTreeMap<String, String>,
    /// Its parameters, by key.
    pub parameters: BTreeMap<String, String>,
}

impl Stack {
    /// An output the stack must have.
    pub fn output(&self, key: &str) -> Result<&str, InstallError> {
        self.outputs
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| InstallError::MissingOutput {
                stack: self.name.clone(),
                key: key.to_string(),
            })
    }
}

/// Why the manifests cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The stack lacks an output (not nodesmith's stack, or an older template).
    #[error("stack {stack} has no output {key}: is it a nodesmith stack, deployed from this release's template.yaml?")]
    MissingOutput {
        /// The stack.
        stack: String,
        /// The output.
        key: String,
    },
    /// The stack does not exist or cannot be read.
    #[error("cannot read stack {stack}")]
    Describe {
        /// The stack.
        stack: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A bundled manifest is not what this module expects (a build error).
    #[error("the bundled manifest {what} cannot be used")]
    Bundled {
        /// What is wrong with it.
        what: String,
    },
}

/// The YAML documents of one file, as JSON values.
fn documents(text: &str, file: &str) -> Result<Vec<Value>, InstallError> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| {
            <Value as serde::Deserialize>::deserialize(d).map_err(|e| InstallError::Bundled {
                what: format!("{file}: {e}"),
            })
        })
        .filter(|v| !matches!(v, Ok(Value::Null)))
        .collect()
}

/// The manifests `kubectl apply -f -` takes to install nodesmith's
/// in-cluster part for `stack`, its forwarder running `image` (pure).
pub fn manifests(stack: &Stack, image: &str) -> Result<String, InstallError> {
    let queue = stack.output(QUEUE_OUTPUT)?;
    let irsa = match stack.parameters.get(IRSA_PARAMETER).filter(|p| !p.trim().is_empty()) {
        Some(_) => Some(stack.output(IRSA_OUTPUT)?),
        None => None,
    };
    let mut docs = documents(NAMESPACE, "namespace.yaml")?;
    docs.extend(documents(FORWARDER, "forwarder.yaml")?);
    docs.extend(documents(LAMBDA_RBAC, "lambda-rbac.yaml")?);
    let (mut queue_set, mut image_set) = (false, false);
    for doc in &mut docs {
        match doc["kind"].as_str() {
            Some("ConfigMap") => {
                doc["data"]["QUEUE_URL"] = Value::from(queue);
                queue_set = true;
            }
            Some("Deployment") => {
                for c in doc["spec"]["template"]["spec"]["containers"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    c["image"] = Value::from(image);
                    image_set = true;
                }
            }
            Some("ServiceAccount") => {
                if let Some((key, value)) = irsa.and_then(|a| a.split_once(':')) {
                    doc["metadata"]["annotations"][key.trim()] = Value::from(value.trim());
                }
            }
            _ => {}
        }
    }
    if !(queue_set && image_set) {
        return Err(InstallError::Bundled {
            what: "forwarder.yaml: no ConfigMap or no container to fill in".to_string(),
        });
    }
    let mut out = format!(
        "# nodesmith's in-cluster part for stack {}: `kubectl apply -f -`.\n# The CRDs are apart: `nodesmith install --crds | kubectl apply --server-side -f -`.\n",
        stack.name
    );
    for doc in &docs {
        let text = serde_yaml_ng::to_string(doc).map_err(|e| InstallError::Bundled { what: e.to_string() })?;
        out.push_str("---\n");
        out.push_str(&text);
    }
    Ok(out)
}

/// Reads a stack's outputs and parameters from CloudFormation.
pub async fn describe_stack(cfn: &aws_sdk_cloudformation::Client, name: &str) -> Result<Stack, InstallError> {
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| InstallError::Describe {
        stack: name.to_string(),
        source,
    };
    let answer = cfn
        .describe_stacks()
        .stack_name(name)
        .send()
        .await
        .map_err(|e| failed(aws_sdk_cloudformation::error::DisplayErrorContext(e).to_string().into()))?;
    let Some(s) = answer.stacks().first() else {
        return Err(failed("CloudFormation answered with no stack".into()));
    };
    Ok(Stack {
        name: name.to_string(),
        outputs: s
            .outputs()
            .iter()
            .filter_map(|o| Some((o.output_key()?.to_string(), o.output_value()?.to_string())))
            .collect(),
        parameters: s
            .parameters()
            .iter()
            .filter_map(|p| Some((p.parameter_key()?.to_string(), p.parameter_value()?.to_string())))
            .collect(),
    })
}

#[cfg(test)]
mod tests;
