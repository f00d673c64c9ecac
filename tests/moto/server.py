"""moto's server for nodesmith's tests, with the parts moto lacks seeded in.

Started by the Rust harness (tests/src/moto.rs). Prints "READY <port>" once
listening on 127.0.0.1, then reads one command per line on stdin and answers
"OK" (or "ERR <why>"):

  reset              wipe all state, then seed the EKS AMIs and SSM parameters
  spot <json>        set spot prices: [{"type","zone","price"}, ...]
  param <name> <v>   a new version of a public SSM parameter (a new AMI behind an alias)

moto stores everything in this process, so seeding goes straight into its
backends (PutParameter refuses /aws/... names). The process exits when stdin
closes, so a crashed test run never leaves a server behind.
"""

import json
import logging
import sys
import threading
from datetime import datetime, timezone

from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.ec2.models.amis import Ami
from moto.ec2.models.fleets import Fleet
from moto.ec2.responses import spot_instances
from moto.core.responses import ActionResult
from moto.moto_api import _internal as moto_api
from moto.moto_server import threaded_moto_server
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from moto.ssm.models import Parameter, ssm_backends

REGION = "us-east-1"
# Regions seeded with the EKS AMIs and their SSM parameters (tests run in a second region too).
SEEDED_REGIONS = ["us-east-1", "eu-west-1"]
K8S_VERSION = "1.33"

# Public EKS AMIs as the real SSM parameters name them; ids are made up but stable.
EKS_AMIS = [
    ("ami-0a1b2c3d4e5f60001", "x86_64", "amazon-eks-node-al2023-x86_64-standard-1.33-v20261101",
     f"/aws/service/eks/optimized-ami/{K8S_VERSION}/amazon-linux-2023/x86_64/standard/recommended/image_id"),
    ("ami-0a1b2c3d4e5f60002", "arm64", "amazon-eks-node-al2023-arm64-standard-1.33-v20261101",
     f"/aws/service/eks/optimized-ami/{K8S_VERSION}/amazon-linux-2023/arm64/standard/recommended/image_id"),
    ("ami-0a1b2c3d4e5f60003", "x86_64", "amazon-eks-node-al2023-x86_64-nvidia-1.33-v20261101",
     f"/aws/service/eks/optimized-ami/{K8S_VERSION}/amazon-linux-2023/x86_64/nvidia/recommended/image_id"),
    ("ami-0a1b2c3d4e5f60004", "x86_64", "bottlerocket-aws-k8s-1.33-x86_64-v1.40.0",
     f"/aws/service/bottlerocket/aws-k8s-{K8S_VERSION}/x86_64/latest/image_id"),
    ("ami-0a1b2c3d4e5f60005", "arm64", "bottlerocket-aws-k8s-1.33-aarch64-v1.40.0",
     f"/aws/service/bottlerocket/aws-k8s-{K8S_VERSION}/arm64/latest/image_id"),
]

SPOT_PRICES = {}


class AtomicDynamoDB(DomainDispatcherApplication):
    """DynamoDB applies each conditional write atomically; moto's threaded
    server checks and writes without a lock, so two racing conditional puts
    can both succeed. Serialise DynamoDB requests to keep DynamoDB's semantics
    (leases and fenced writes depend on them)."""

    _lock = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB"):
            with self._lock:
                return super().__call__(environ, start_response)
        return super().__call__(environ, start_response)


def seed():
    for region in SEEDED_REGIONS:
        seed_region(region)


def seed_region(region):
    ec2 = ec2_backends[DEFAULT_ACCOUNT_ID][region]
    ssm = ssm_backends[DEFAULT_ACCOUNT_ID][region]
    now = datetime.now(timezone.utc)
    for ami_id, arch, name, param in EKS_AMIS:
        ec2.amis[ami_id] = Ami(
            ec2, ami_id, name=name, description=name, owner_id="602401143452",
            owner_alias="amazon", public=True, virtualization_type="hvm",
            architecture=arch, root_device_type="ebs", root_device_name="/dev/xvda",
            region_name=region, boot_mode="uefi",
        )
        ssm._parameters[param].append(Parameter(
            account_id=DEFAULT_ACCOUNT_ID, name=param, value=ami_id,
            parameter_type="String", description=None, allowed_pattern=None,
            keyid=None, last_modified_date=now, version=1, data_type="aws:ec2:image",
        ))


def set_public_parameter(name, value):
    """A new version of a public (`/aws/...`) parameter, which PutParameter
    refuses: e.g. a new AMI behind an alias."""
    for region in SEEDED_REGIONS:
        versions = ssm_backends[DEFAULT_ACCOUNT_ID][region]._parameters[name]
        versions.append(Parameter(
            account_id=DEFAULT_ACCOUNT_ID, name=name, value=value,
            parameter_type="String", description=None, allowed_pattern=None,
            keyid=None, last_modified_date=datetime.now(timezone.utc),
            version=len(versions) + 1, data_type="aws:ec2:image",
        ))


def describe_spot_price_history(self):
    """moto answers every offering with one fixed price; answer the seeded ones."""
    types = self._get_param("InstanceTypes", [])
    filters = self._filters_from_querystring()
    offerings = self.ec2_backend.describe_spot_price_history(types, filters)
    history = [
        {
            "InstanceType": o["InstanceType"],
            "ProductDescription": "Linux/UNIX (Amazon VPC)",
            "SpotPrice": f"{SPOT_PRICES[(o['InstanceType'], o['Location'])]:.6f}",
            "AvailabilityZone": o["Location"],
            "Timestamp": "2026-11-01T00:00:00.000Z",
        }
        for o in offerings
        if (o["InstanceType"], o["Location"]) in SPOT_PRICES
    ]
    return ActionResult({"SpotPriceHistory": history})


_fleet_init = Fleet.__init__


def template_security_groups(backend, launch_template_spec):
    """The security group ids a fleet's launch template gives its instances."""
    spec = launch_template_spec or {}
    template = backend.launch_templates.get(spec.get("LaunchTemplateId"))
    if template is None:
        return []
    data = template.get_version(spec.get("Version", template.default_version_number)).data
    groups = list(data.get("SecurityGroupIds") or [])
    for nic in data.get("NetworkInterfaces") or []:
        if str(nic.get("DeviceIndex", 0)) == "0":
            groups.extend(nic.get("Groups") or [])
    return groups


def fleet_init(self, ec2_backend, *args, **kwargs):
    """EC2 gives a fleet's instances the security groups of their launch
    template; moto launches them in the VPC's default group, which would read
    as security-group drift on every node."""
    _fleet_init(self, ec2_backend, *args, **kwargs)
    launched = [(i["instance"], i.get("launch_spec")) for i in self.on_demand_instances]
    launched += [(r.instance, r.launch_spec) for r in self.spot_requests if r.instance]
    for instance, launch_spec in launched:
        ids = template_security_groups(ec2_backend, getattr(launch_spec, "launch_template_spec", None))
        if ids:
            instance.security_groups = [ec2_backend.get_security_group_from_id(g) for g in ids]


def main():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    threaded_moto_server.DomainDispatcherApplication = AtomicDynamoDB
    spot_instances.SpotInstances.describe_spot_price_history = describe_spot_price_history
    Fleet.__init__ = fleet_init
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    seed()
    _, port = server.get_host_and_port()
    print(f"READY {port}", flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        try:
            if cmd == "reset":
                moto_api.moto_api_backend.reset()
                SPOT_PRICES.clear()
                seed()
            elif cmd == "param":
                name, _, value = arg.partition(" ")
                set_public_parameter(name, value)
            elif cmd == "spot":
                for p in json.loads(arg):
                    SPOT_PRICES[(p["type"], p["zone"])] = float(p["price"])
            else:
                raise ValueError(f"unknown command {cmd!r}")
            print("OK", flush=True)
        except Exception as e:  # answer, never die: the test reports it
            print(f"ERR {type(e).__name__}: {e}".replace("\n", " "), flush=True)
    server.stop()


if __name__ == "__main__":
    main()
