"""moto's server for nodesmith's tests, with the parts moto lacks seeded in.

Started by the Rust harness (tests/src/moto.rs). Prints "READY <port>" once
listening on 127.0.0.1, then reads one command per line on stdin and answers
"OK" (or "ERR <why>"):

  reset              wipe all state (capacity reservations too), then seed the
                     EKS AMIs and SSM parameters
  spot <json>        set spot prices: [{"type","zone","price"}, ...]
  param <name> <v>   a new version of a public SSM parameter (a new AMI behind an alias)
  reservation <json> seed a capacity reservation, e.g. a capacity block, which
                     CreateCapacityReservation cannot make: {"type", "zone",
                     "count"} and optionally "id" (cr- + 17 hex; random when
                     absent), "region" (us-east-1), "reservationType"
                     ("default" or "capacity-block"), "endDate" (ISO-8601; a
                     capacity block without one ends in 24 hours), "tags"
                     ({key: value}), "ownerId" (this account), "matchCriteria"
                     ("targeted")
  prices <json>      set the Price List's on-demand prices of a region's
                     products: {"region": "eu-west-1", "prices": {"m5.large": 0.107}}
  arc-resource <json>  register an ARC managed resource, as EKS registers a
                     cluster with zonal shift enabled: {"arn"} and optionally
                     "name" (the ARN's last part)
  zonal-shift <json> a zonal shift on a registered resource, as StartZonalShift
                     (or ARC, for a practice run) starts one: {"resource",
                     "awayFrom" (a zone id of the resource's region)} and
                     optionally "expiresIn" (seconds, 1 hour) or "expiryTime"
                     (ISO-8601), "status" (ACTIVE, EXPIRED or CANCELED),
                     "appliedStatus" (APPLIED), "shiftType" (ZONAL_SHIFT),
                     "comment"
  autoshift <json>   an autoshift in progress on a registered resource:
                     {"resource", "awayFrom"} and optionally "appliedStatus"
  impaired <json>    fail a running instance's status checks, which moto always
                     passes: {"instanceId"} and optionally "checks" (["system"],
                     or "instance", or both), "since" (ISO-8601 with a timezone;
                     now when absent) and "region" (us-east-1)

moto's own stock AMIs are not loaded (MOTO_EC2_LOAD_DEFAULT_AMIS): the
seeded EKS and Bottlerocket images are the only ones.

An EC2 resource's tags are read from the tag store's entry for it, not
through a scan of every tag of every resource as moto reads them (the same
answers; a DescribeInstances over 5,000 tagged instances took 75 s that way).
Likewise a DynamoDB Query reads the partition it names (an index Query, the
table's items unsorted, since it sorts them by the index after), not every
item of the table sorted by key. An SQS queue's calls do not slow with its
depth as moto's did (a SendMessageBatch took seconds with 20,000 messages
queued): a send or a receive does not count the queue's messages, the
visible messages are found with one reading of the clock, and a
DeleteMessage finds its message by the receipt handle.

moto stores everything in this process, so seeding goes straight into its
backends (PutParameter refuses /aws/... names). The process exits when stdin
closes, so a crashed test run never leaves a server behind.

CreateFleet gives its instances what their launch template names, as EC2
does and moto does not: the security groups, and the IAM instance profile
(associated, and shown by DescribeInstances as IamInstanceProfile with the
profile's Arn and Id), so a test can see which profile a node runs with.

moto has no On-Demand Capacity Reservations; this adds Create-, Describe- and
CancelCapacityReservation, and makes CreateFleet honour a launch template's
CapacityReservationTarget: the reservation's type and zone, its capacity
type (on-demand, or capacity-block with the capacity-block market), its free
count (a shortfall is a ReservationCapacityExceeded entry in the response's
Errors, as EC2 reports an instant fleet's failed overrides), and the instances
it launches carry CapacityReservationId and give their slot back when
terminated. A reservation that expires (at its EndDate) or is cancelled lets
its instances run on outside it: DescribeInstances stops naming it. EC2
terminates a capacity block's instances from 30 minutes before its end.

moto has no AWS Price List API; this serves GetProducts (JSON 1.1,
`AWSPriceListService.GetProducts`) for EC2 compute products as AWS shapes
them: each PriceList entry a JSON string (product attributes, OnDemand and
Reserved terms), pages of at most MaxResults (default and maximum 100)
chained by a NextToken bound to the query. us-east-1's on-demand prices are
the bundled table's; eu-west-1's are a handful of published prices, the rest
the us-east-1 price x 1.115. Every type also has the products a filter must
leave out (Windows, dedicated tenancy, unused capacity reservations). It is
as strict as AWS: the API answers only at its endpoints (us-east-1,
eu-central-1, ap-south-1), refuses a missing ServiceCode, filter types AWS
does not know, empty or missing filter members, more than 50 filters,
MaxResults outside 1-100, a format other than aws_v1 and a NextToken of
another query; a filter on a field no product has is ignored, as AWS ignores
it.

moto passes every status check and answers DescribeInstanceStatus in one
page; here an instance seeded `impaired` reports the checks named failed
(Status impaired, its reachability detail failed with ImpairedSince) while it
runs, and DescribeInstanceStatus pages by MaxResults (5-1000, refused outside,
and refused together with InstanceIds, as EC2 refuses them) and NextToken.

moto has no placement groups; this adds CreatePlacementGroup and
DescribePlacementGroups (by GroupNames or GroupIds, an unknown one refused
as EC2 refuses it; filters group-name, group-arn, state, strategy,
spread-level, tag:<key>, tag-key), groups `available` at once.

moto has no ARC zonal shift; this serves GetManagedResource (REST JSON,
`GET /managedresources/{resourceIdentifier}`, signed for `arc-zonal-shift`)
for resources the harness registered: the resource's ARN and name, its
appliedWeights (1.0 per zone of its region, 0.0 away from an applied
shift), the zonal shifts active now (expired and cancelled ones are gone,
as ARC lists only active shifts; timestamps as epoch seconds), its
autoshifts and zonalAutoshiftStatus. As strict as ARC: an identifier
outside 8-1024 characters is a ValidationException, an unregistered one a
404 ResourceNotFoundException, any other route an UnknownOperationException;
a shift can only be seeded on a registered resource, away from a zone id
of its region.
"""

import base64
import functools
import hashlib
import json
import logging
import os
import re
import sys
import threading
import uuid
import weakref
from urllib.parse import unquote
from datetime import datetime, timedelta, timezone

# Only the images seed_region makes: moto's ~1,300 stock AMIs per region
# (each with a volume and a snapshot) made every reset take seconds and
# every DescribeImages filter through them, and no test uses them.
os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")

import botocore.session
from botocore.utils import parse_timestamp

from moto import backends as moto_backends
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.exceptions import EC2ClientError, MissingParameterError
from moto.ec2.models import ec2_backends
from moto.ec2.models.amis import Ami
from moto.ec2.models.core import TaggedEC2Resource
from moto.ec2.models.fleets import Fleet
from moto.ec2.models.instance_types import INSTANCE_TYPES
from moto.ec2.models.instances import Instance
from moto.ec2.responses import EC2Response, fleets as fleet_responses, spot_instances
from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix, random_id, simple_aws_filter_to_re
from moto.iam.exceptions import NotFoundException as IAMNotFoundException
from moto.iam.models import iam_backends
from moto.core.responses import ActionResult
from moto.dynamodb.models.table import Table as DynamoTable
from moto.moto_api import _internal as moto_api
from moto.moto_server import threaded_moto_server
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from moto.core.utils import unix_time_millis
from moto.sqs.models import Message as SqsMessage, Queue as SqsQueue, SQSBackend
from moto.ssm.models import Parameter, ssm_backends
from moto.utilities.utils import get_partition

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
# Instances whose status checks fail: id -> {"checks": {"system", "instance"}, "since": datetime}.
IMPAIRED = {}
IMPAIRED_LOCK = threading.Lock()
STATUS_CHECKS = {"system", "instance"}


class AtomicDynamoDB(DomainDispatcherApplication):
    """DynamoDB applies each conditional write atomically; moto's threaded
    server checks and writes without a lock, so two racing conditional puts
    can both succeed. Serialise DynamoDB requests to keep DynamoDB's semantics
    (leases and fenced writes depend on them). Price List API calls, which
    moto has no backend for, go to price_list_app."""

    _lock = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("AWSPriceListService."):
            return price_list_app(environ, start_response)
        if signing_service(environ) == "arc-zonal-shift":
            return arc_app(environ, start_response)
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB"):
            with self._lock:
                return super().__call__(environ, start_response)
        return super().__call__(environ, start_response)


def seed():
    for region in SEEDED_REGIONS:
        seed_region(region)
    seed_price_list()


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


def template_profile(backend, launch_template_spec):
    """The IAM instance profile a fleet's launch template names (moto's
    IAM model), or None: none named, or IAM does not have it."""
    spec = launch_template_spec or {}
    template = backend.launch_templates.get(spec.get("LaunchTemplateId"))
    if template is None:
        return None
    data = template.get_version(spec.get("Version", template.default_version_number)).data
    named = data.get("IamInstanceProfile") or {}
    iam = iam_backends[backend.account_id][get_partition(backend.region_name)]
    try:
        if named.get("Arn"):
            return iam.get_instance_profile_by_arn(named["Arn"])
        if named.get("Name"):
            return iam.get_instance_profile(named["Name"])
    except IAMNotFoundException:
        return None
    return None


def attach_profile(backend, instance, profile):
    """What EC2 does with a launch template's instance profile: the instance is
    associated with it, and DescribeInstances shows the profile's ARN and id."""
    if instance.id not in backend.iam_instance_profile_associations:
        backend.associate_iam_instance_profile(instance.id, iam_instance_profile_arn=profile.arn)
    instance.iam_instance_profile = {"Arn": profile.arn, "Id": profile.id}


def fleet_init(self, ec2_backend, fleet_id, on_demand_options, spot_options, capacity, configs,
               excess_capacity_termination_policy, replace_unhealthy_instances,
               terminate_instances_with_expiration, fleet_type, valid_from, valid_until,
               tag_specifications):
    """EC2 gives a fleet's instances the security groups and the instance
    profile of their launch template; moto launches them in the VPC's default
    group (which would read as security-group drift on every node) and with no
    profile (so nothing could show a node losing its credentials). Launch templates that target a
    capacity reservation launch through launch_reserved."""
    def init(configs):
        _fleet_init(self, ec2_backend, fleet_id, on_demand_options, spot_options, capacity, configs,
                    excess_capacity_termination_policy, replace_unhealthy_instances,
                    terminate_instances_with_expiration, fleet_type, valid_from, valid_until,
                    tag_specifications)

    targeted = any(
        (found := fleet_template(ec2_backend, config.get("LaunchTemplateSpecification") or {}))
        and reservation_target(found[0].data)
        for config in configs or []
    )
    if targeted:
        with RESERVATIONS_LOCK:
            launch_reserved(self, ec2_backend, capacity, configs, fleet_type, init)
    else:
        init(configs)
    launched = [(i["instance"], i.get("launch_spec")) for i in self.on_demand_instances]
    launched += [(r.instance, r.launch_spec) for r in self.spot_requests if r.instance]
    for instance, launch_spec in launched:
        ids = template_security_groups(ec2_backend, getattr(launch_spec, "launch_template_spec", None))
        if ids:
            instance.security_groups = [ec2_backend.get_security_group_from_id(g) for g in ids]
        profile = template_profile(ec2_backend, getattr(launch_spec, "launch_template_spec", None))
        if profile is not None:
            attach_profile(ec2_backend, instance, profile)


# Capacity reservations per (account, region), by id, as EC2's API shapes
# them: moto has none. RESERVATIONS_LOCK guards them and their counts, since
# moto's server answers requests on threads and two fleets must not both take
# a reservation's last slot.
RESERVATIONS = {}
RESERVATIONS_LOCK = threading.RLock()
RESERVATION_ID = re.compile(r"cr-[0-9a-f]{17}")
# EC2 begins terminating a capacity block's instances this long before the block ends.
BLOCK_RECLAIM_AHEAD = timedelta(minutes=30)
# States CancelCapacityReservation accepts (EC2's API reference).
CANCELLABLE = {"active", "assessing", "scheduled", "delayed"}
# DescribeCapacityReservations filters on a plain field; tag filters aside.
RESERVATION_FILTERS = {
    "instance-type": "InstanceType",
    "owner-id": "OwnerId",
    "instance-platform": "InstancePlatform",
    "availability-zone": "AvailabilityZone",
    "tenancy": "Tenancy",
    "outpost-arn": "OutpostArn",
    "state": "State",
    "start-date": "StartDate",
    "end-date": "EndDate",
    "end-date-type": "EndDateType",
    "instance-match-criteria": "InstanceMatchCriteria",
    "placement-group-arn": "PlacementGroupArn",
    "reservation-type": "ReservationType",
}
SEED_FIELDS = {"id", "type", "zone", "count", "region", "reservationType", "endDate",
               "tags", "ownerId", "matchCriteria"}


@functools.cache
def ec2_enum(shape):
    """The values EC2's API model allows for an enum shape."""
    return botocore.session.get_session().get_service_model("ec2").shape_for(shape).enum


def invalid(message):
    return EC2ClientError("InvalidParameterValue", message)


def reservations_in(account, region):
    """A region's reservations (hold RESERVATIONS_LOCK). EC2 expires a
    reservation at its end date by itself, and terminates a capacity block's
    instances from BLOCK_RECLAIM_AHEAD before its end, so do that on every look."""
    found = RESERVATIONS.setdefault((account, region), {})
    now = datetime.now(timezone.utc)
    ended, reclaimed = set(), set()
    for rid, r in found.items():
        if r["State"] != "active" or not r.get("EndDate"):
            continue
        if r["ReservationType"] == "capacity-block" and r["EndDate"] - BLOCK_RECLAIM_AHEAD <= now:
            reclaimed.add(rid)
        if r["EndDate"] <= now:
            r["State"] = "expired"
            r["AvailableInstanceCount"] = 0
            ended.add(rid)
    if ended or reclaimed:
        for instance in list(ec2_backends[account][region].all_instances()):
            rid = getattr(instance, "capacity_reservation_id", None)
            if rid in reclaimed and instance._state.name not in ("shutting-down", "terminated"):
                instance.terminate()
            elif rid in ended:
                leave_reservation(instance)
    return found


def leave_reservation(instance):
    """An instance whose reservation expired or was cancelled runs on outside
    it, at the On-Demand rate: DescribeInstances no longer names the
    reservation (what Karpenter relabels a node by)."""
    instance.capacity_reservation_id = None


def instances_leave(account, region, rid):
    """Every instance of a reservation that is no longer active leaves it."""
    for instance in ec2_backends[account][region].all_instances():
        if getattr(instance, "capacity_reservation_id", None) == rid:
            leave_reservation(instance)


def checked_reservation_id(rid):
    if not RESERVATION_ID.fullmatch(rid or ""):
        raise EC2ClientError(
            "InvalidCapacityReservationId.Malformed",
            f"Invalid id: \"{rid}\" (expecting \"cr-xxxxxxxxxxxxxxxxx\")",
        )
    return rid


def reservation_not_found(rid):
    return EC2ClientError(
        "InvalidCapacityReservationId.NotFound",
        f"The capacity reservation ID '{rid}' does not exist",
    )


def zone_in(backend, name=None, zone_id=None):
    """The region's zone with this name or id, or None (another region's)."""
    for zone in backend.describe_availability_zones():
        if (name and zone.name == name) or (zone_id and zone.zone_id == zone_id):
            return zone
    return None


def new_reservation(account, region, rid, instance_type, zone, count, *, platform="Linux/UNIX",
                    tenancy="default", match="open", kind="default", end=None, tags=None,
                    owner=None, ebs_optimized=False, ephemeral_storage=False):
    """A reservation as DescribeCapacityReservations returns it."""
    now = datetime.now(timezone.utc).replace(microsecond=0)
    r = {
        "CapacityReservationId": rid,
        "OwnerId": owner or account,
        "CapacityReservationArn":
            f"arn:{get_partition(region)}:ec2:{region}:{owner or account}:capacity-reservation/{rid}",
        "AvailabilityZoneId": zone.zone_id,
        "InstanceType": instance_type,
        "InstancePlatform": platform,
        "AvailabilityZone": zone.name,
        "Tenancy": tenancy,
        "TotalInstanceCount": count,
        "AvailableInstanceCount": count,
        "EbsOptimized": ebs_optimized,
        "EphemeralStorage": ephemeral_storage,
        "State": "active",
        "StartDate": now,
        "EndDateType": "limited" if end else "unlimited",
        "InstanceMatchCriteria": match,
        "CreateDate": now,
        "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()],
        "ReservationType": kind,
        "CapacityAllocations": [],
    }
    if end:
        r["EndDate"] = end
    return r


def create_capacity_reservation(self):
    """CreateCapacityReservation, for capacity from now on (EC2 offers no
    capacity blocks through it: those are bought, see the `reservation`
    command)."""
    for name in ("InstanceType", "InstancePlatform", "InstanceCount"):
        if self._get_param(name) in (None, ""):
            raise MissingParameterError(name)
    if self._get_param("StartDate") or self._get_param("CommitmentDuration"):
        # Not EC2's refusal: this server does not model future-dated reservations.
        raise EC2ClientError("UnsupportedOperation",
                             "future-dated Capacity Reservations are not modelled by the test server")
    backend = self.ec2_backend
    instance_type = self._get_param("InstanceType")
    if instance_type not in INSTANCE_TYPES:
        raise invalid(f"Invalid value '{instance_type}' for InstanceType.")
    platform = self._get_param("InstancePlatform")
    if platform not in ec2_enum("CapacityReservationInstancePlatform"):
        raise invalid(f"Invalid value '{platform}' for InstancePlatform.")
    count = self._get_int_param("InstanceCount")
    if not 1 <= count <= 1000:
        raise invalid(f"Invalid value '{count}' for InstanceCount. Valid range: 1 - 1000.")
    zone_name, zone_id = self._get_param("AvailabilityZone"), self._get_param("AvailabilityZoneId")
    if zone_name and zone_id:
        raise EC2ClientError("InvalidParameterCombination",
                             "Only one of AvailabilityZone and AvailabilityZoneId can be specified.")
    if not (zone_name or zone_id):
        raise MissingParameterError("AvailabilityZone")
    zone = zone_in(backend, zone_name, zone_id)
    if zone is None:
        raise invalid(f"Invalid availability zone: [{zone_name or zone_id}]")
    tenancy = self._get_param("Tenancy") or "default"
    if tenancy not in ec2_enum("CapacityReservationTenancy"):
        raise invalid(f"Invalid value '{tenancy}' for Tenancy.")
    match = self._get_param("InstanceMatchCriteria") or "open"
    if match not in ec2_enum("InstanceMatchCriteria"):
        raise invalid(f"Invalid value '{match}' for InstanceMatchCriteria.")
    end_type = self._get_param("EndDateType") or "unlimited"
    if end_type not in ec2_enum("EndDateType"):
        raise invalid(f"Invalid value '{end_type}' for EndDateType.")
    end = self._get_param("EndDate")
    if end_type == "limited" and not end:
        raise MissingParameterError("EndDate")
    if end_type == "unlimited" and end:
        raise EC2ClientError("InvalidParameterCombination",
                             "EndDate cannot be specified when EndDateType is unlimited.")
    if end:
        # moto parses timestamps by the API model; naive ones are UTC.
        end = end if isinstance(end, datetime) else parse_timestamp(end)
        end = end.replace(tzinfo=end.tzinfo or timezone.utc).astimezone(timezone.utc)
        if end <= datetime.now(timezone.utc):
            raise invalid("EndDate must be in the future.")
    tags = self._parse_tag_specification("capacity-reservation").get("capacity-reservation", {})
    self.error_on_dryrun()
    account, region = self.current_account, self.region
    with RESERVATIONS_LOCK:
        store = reservations_in(account, region)
        rid = random_id("cr")
        store[rid] = new_reservation(
            account, region, rid, instance_type, zone, count, platform=platform,
            tenancy=tenancy, match=match, end=end, tags=tags,
            ebs_optimized=self._get_bool_param("EbsOptimized", False),
            ephemeral_storage=self._get_bool_param("EphemeralStorage", False),
        )
        return ActionResult({"CapacityReservation": dict(store[rid])})


def reservation_values(r, name):
    """The values of a reservation a filter tests; None for a filter EC2 lacks."""
    if name == "tag-key":
        return [t["Key"] for t in r["Tags"]]
    if name == "tag-value":
        return [t["Value"] for t in r["Tags"]]
    if name.startswith("tag:"):
        return [t["Value"] for t in r["Tags"] if t["Key"] == name[4:]]
    if name not in RESERVATION_FILTERS:
        return None
    value = r.get(RESERVATION_FILTERS[name])
    if isinstance(value, datetime):
        value = value.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return [] if value is None else [str(value)]


def describe_capacity_reservations(self):
    """DescribeCapacityReservations: ids (each must exist) and filters, ANDed;
    filter values take EC2's * and ? wildcards."""
    ids = [checked_reservation_id(i) for i in self._get_param("CapacityReservationIds", [])]
    filters = self._filters_from_querystring()
    for name in filters:
        if reservation_values({"Tags": []}, name) is None:
            raise invalid(f"The filter '{name}' is invalid")
    max_results = self._get_int_param("MaxResults")
    if max_results is not None and not 1 <= max_results <= 1000:
        raise invalid(f"Value ( {max_results} ) for parameter maxResults is invalid. "
                      "Expecting a value between 1 and 1000.")
    token = self._get_param("NextToken")
    if token is not None and not token.isdigit():
        raise EC2ClientError("InvalidPaginationToken", f"Invalid pagination token: {token}")
    self.error_on_dryrun()
    with RESERVATIONS_LOCK:
        store = reservations_in(self.current_account, self.region)
        for rid in ids:
            if rid not in store:
                raise reservation_not_found(rid)
        found = [dict(r) for r in store.values() if not ids or r["CapacityReservationId"] in ids]
    for name, patterns in filters.items():
        regexes = [re.compile(simple_aws_filter_to_re(p)) for p in patterns]
        found = [r for r in found
                 if any(x.match(v) for v in reservation_values(r, name) for x in regexes)]
    start = int(token or 0)
    end = len(found) if max_results is None else start + max_results
    result = {"CapacityReservations": found[start:end]}
    if end < len(found):
        result["NextToken"] = str(end)
    return ActionResult(result)


def cancel_capacity_reservation(self):
    """CancelCapacityReservation: the capacity is released (instances in it
    keep running, outside it); a capacity block cannot be cancelled."""
    rid = self._get_param("CapacityReservationId")
    if not rid:
        raise MissingParameterError("CapacityReservationId")
    checked_reservation_id(rid)
    self.error_on_dryrun()
    with RESERVATIONS_LOCK:
        r = reservations_in(self.current_account, self.region).get(rid)
        if r is None:
            raise reservation_not_found(rid)
        if r["ReservationType"] == "capacity-block":
            raise EC2ClientError("UnsupportedOperation", f"You can't cancel a Capacity Block ({rid}).")
        if r["State"] not in CANCELLABLE:
            raise EC2ClientError("IncorrectState",
                                 f"The Capacity Reservation {rid} is {r['State']} and cannot be cancelled.")
        r["State"] = "cancelled"
        r["AvailableInstanceCount"] = 0
        instances_leave(self.current_account, self.region, rid)
    return ActionResult({"Return": True})


def seed_reservation(spec):
    """The `reservation` command: a reservation straight into the store, as
    EC2 would hold a bought capacity block (or any reservation a test needs)."""
    unknown = set(spec) - SEED_FIELDS
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    region = spec.get("region", REGION)
    if region not in ec2_backends[DEFAULT_ACCOUNT_ID].regions:
        raise ValueError(f"unknown region {region!r}")
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][region]
    instance_type = spec["type"]
    if instance_type not in INSTANCE_TYPES:
        raise ValueError(f"unknown instance type {instance_type!r}")
    zone = zone_in(backend, spec["zone"])
    if zone is None:
        raise ValueError(f"zone {spec['zone']!r} is not in {region}")
    count = spec["count"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"count must be an integer >= 1, not {count!r}")
    kind = spec.get("reservationType", "default")
    if kind not in ec2_enum("CapacityReservationType"):
        raise ValueError(f"reservationType must be one of {ec2_enum('CapacityReservationType')}")
    match = spec.get("matchCriteria", "targeted")
    if match not in ec2_enum("InstanceMatchCriteria"):
        raise ValueError(f"matchCriteria must be one of {ec2_enum('InstanceMatchCriteria')}")
    tags = spec.get("tags", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise ValueError("tags must map strings to strings")
    end = spec.get("endDate")
    if end:
        end = datetime.fromisoformat(end)
        if end.tzinfo is None:
            raise ValueError("endDate needs a timezone (e.g. a trailing Z)")
        end = end.astimezone(timezone.utc)
    elif kind == "capacity-block":
        # Capacity blocks always end.
        end = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=1)
    with RESERVATIONS_LOCK:
        store = reservations_in(DEFAULT_ACCOUNT_ID, region)
        rid = checked_reservation_id(spec["id"]) if spec.get("id") else random_id("cr")
        if rid in store:
            raise ValueError(f"{rid} already exists")
        store[rid] = new_reservation(
            DEFAULT_ACCOUNT_ID, region, rid, instance_type, zone, count, match=match,
            kind=kind, end=end, tags=tags, owner=spec.get("ownerId"),
        )
        reservations_in(DEFAULT_ACCOUNT_ID, region)  # an endDate already past reads as expired


def fleet_template(backend, spec):
    """A fleet config's launch template version and the template spec as
    CreateFleet reports it; None when moto will refuse the config itself."""
    if spec.get("LaunchTemplateId"):
        template = backend.launch_templates.get(spec["LaunchTemplateId"])
    else:
        template = backend.launch_templates.get(
            backend.launch_template_name_to_ids.get(spec.get("LaunchTemplateName")))
    if template is None:
        return None
    try:
        version = template.get_version(spec.get("Version") or template.default_version_number)
    except EC2ClientError:
        return None
    return version, dict(spec, LaunchTemplateId=template.id, Version=str(version.number))


def reservation_target(data):
    spec = data.get("CapacityReservationSpecification") or {}
    return (spec.get("CapacityReservationTarget") or {}).get("CapacityReservationId")


def override_zone(backend, override, data):
    """The zone an override launches in: its own, its subnet's or the template's."""
    if override.get("AvailabilityZone"):
        return override["AvailabilityZone"]
    subnet = override.get("SubnetId")
    for nic in data.get("NetworkInterfaces") or []:
        if str(nic.get("DeviceIndex", 0)) == "0":
            subnet = subnet or nic.get("SubnetId")
    if subnet:
        return backend.get_subnet(subnet.split(",")[0].strip()).availability_zone
    return (data.get("Placement") or {}).get("AvailabilityZone")


def reservation_refusal(r, rid, data, capacity_type):
    """Why no override of a template targeting this reservation can launch
    (an error code and message), or None."""
    if not RESERVATION_ID.fullmatch(rid):
        return "InvalidCapacityReservationId.Malformed", f"Invalid id: \"{rid}\""
    if r is None:
        return "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{rid}' does not exist"
    market = (data.get("InstanceMarketOptions") or {}).get("MarketType")
    if r["ReservationType"] == "capacity-block":
        if capacity_type != "capacity-block" or market != "capacity-block":
            return "InvalidParameterValue", (
                f"Capacity Block {rid} takes only instances launched with the DefaultTargetCapacityType "
                "capacity-block and the launch template market type capacity-block.")
    elif capacity_type != "on-demand" or market not in (None, "on-demand"):
        return "InvalidParameterValue", (
            f"Capacity Reservation {rid} takes only On-Demand Instances (DefaultTargetCapacityType "
            f"on-demand), not {capacity_type}{' in the ' + market + ' market' if market else ''}.")
    if r["State"] != "active" or r["AvailableInstanceCount"] < 1:
        return "ReservationCapacityExceeded", capacity_exceeded(rid)
    return None


def capacity_exceeded(rid):
    return (f"The targeted Capacity Reservation ({rid}) does not have enough available "
            "instance capacity to fulfill your request.")


def fleet_error(spec, override, lifecycle, code, message):
    """An entry of CreateFleet's Errors, naming the template and override that failed."""
    failed = {"LaunchTemplateSpecification": spec}
    if override:
        failed["Overrides"] = override
    return {"LaunchTemplateAndOverrides": failed, "Lifecycle": lifecycle,
            "ErrorCode": code, "ErrorMessage": message}


def launch_reserved(fleet, backend, capacity, configs, fleet_type, init):
    """Creates a fleet some of whose launch templates target a capacity
    reservation (hold RESERVATIONS_LOCK). Overrides that cannot launch into
    their reservation are left out of the launch and reported in
    fleet.reservation_errors; launches into a reservation stop at its free
    count, and take from it."""
    capacity_type = capacity.get("DefaultTargetCapacityType") or "on-demand"
    lifecycle = "capacity-block" if capacity_type == "capacity-block" else "on-demand"
    store = reservations_in(backend.account_id, backend.region_name)
    errors, launchable, reserved = [], [], {}  # reserved: template id -> (reservation, spec, overrides)
    for config in configs:
        found = fleet_template(backend, config.get("LaunchTemplateSpecification") or {})
        rid = found and reservation_target(found[0].data)
        if not rid:
            launchable.append(config)
            continue
        version, spec = found
        r = store.get(rid)
        if r and r["ReservationType"] == "capacity-block" and fleet_type != "instant":
            raise invalid("Capacity Blocks can only be used with an EC2 Fleet of type instant.")
        refusal = reservation_refusal(r, rid, version.data, capacity_type)
        kept = []
        for override in config.get("Overrides") or [{}]:
            problem = refusal
            if problem is None:
                instance_type = override.get("InstanceType") or version.data.get("InstanceType")
                zone = override_zone(backend, override, version.data)
                if instance_type != r["InstanceType"] or (zone and zone != r["AvailabilityZone"]):
                    problem = "InvalidParameterValue", (
                        f"{instance_type} in {zone or 'any zone'} does not match Capacity Reservation "
                        f"{rid} ({r['InstanceType']} in {r['AvailabilityZone']}).")
            if problem:
                errors.append(fleet_error(spec, override, lifecycle, *problem))
            else:
                kept.append(override)
        if kept:
            launchable.append(dict(config, Overrides=kept))
            reserved[spec["LaunchTemplateId"]] = (r, spec, kept)

    # moto launches from the cheapest launch spec; cap what it takes from a
    # reservation at what is free and note the shortfall.
    free = {rid: r["AvailableInstanceCount"] for rid, r in store.items()}
    short = set()

    def launch_spec_counts(weight):
        counts, _ = Fleet.get_launch_spec_counts(fleet, weight)
        granted, added = {}, 0.0
        for launch_spec, count in counts.items():
            template_id = (launch_spec.launch_template_spec or {}).get("LaunchTemplateId")
            if template_id in reserved:
                rid = reserved[template_id][0]["CapacityReservationId"]
                if count > free[rid]:
                    short.add(template_id)
                    count = free[rid]
                free[rid] -= count
            if count:
                granted[launch_spec] = count
                added += count * float(launch_spec.weighted_capacity)
        return granted, added

    patched = {"get_launch_spec_counts": launch_spec_counts}
    if not launchable:
        # moto would pick a launch spec out of none.
        patched.update(create_on_demand_requests=lambda weight: None,
                       create_spot_requests=lambda weight: [])
    fleet.__dict__.update(patched)
    try:
        init(launchable)
        # moto launches nothing for the capacity-block capacity type.
        missing = fleet.target_capacity - fleet.fulfilled_capacity
        if capacity_type == "capacity-block" and reserved and missing > 0:
            fleet.create_on_demand_requests(missing)
    finally:
        for name in patched:
            fleet.__dict__.pop(name, None)
    fleet.launch_template_configs = configs

    for item in fleet.on_demand_instances:
        launch_spec = getattr(item.get("launch_spec"), "launch_template_spec", None) or {}
        template_id = launch_spec.get("LaunchTemplateId")
        if template_id not in reserved:
            continue
        r, instance = reserved[template_id][0], item["instance"]
        # What DescribeInstances shows of an instance in a reservation.
        instance.capacity_reservation_id = r["CapacityReservationId"]
        instance.capacity_reservation_specification = {
            "CapacityReservationTarget": {"CapacityReservationId": r["CapacityReservationId"]}}
        if r["ReservationType"] == "capacity-block":
            instance.lifecycle = "capacity-block"
        r["AvailableInstanceCount"] -= 1
    for template_id in short:
        r, spec, kept = reserved[template_id]
        for override in kept:
            errors.append(fleet_error(spec, override, lifecycle, "ReservationCapacityExceeded",
                                      capacity_exceeded(r["CapacityReservationId"])))
    fleet.reservation_errors = errors


_create_fleet_response = fleet_responses.Fleets.create_fleet


def create_fleet_response(self):
    """CreateFleet's answer with what moto's lacks: the failures fleet_init
    recorded, and the capacity-block lifecycle of instances in a capacity block."""
    answer = _create_fleet_response(self)
    result = answer.result
    fleet = self.ec2_backend.get_fleet(result["FleetId"])
    if getattr(fleet, "reservation_errors", None):
        result["Errors"] = fleet.reservation_errors
    for launched in result.get("Instances") or []:
        ids = launched.get("InstanceIds") or []
        if ids and self.ec2_backend.get_instance(ids[0]).lifecycle == "capacity-block":
            launched["Lifecycle"] = "capacity-block"
    return answer


_instance_terminate = Instance.terminate


def instance_terminate(self):
    """EC2 gives a reservation its slot back when the instance in it terminates."""
    was_terminated = self._state.name == "terminated"
    previous = _instance_terminate(self)
    rid = getattr(self, "capacity_reservation_id", None)
    if rid and not was_terminated:
        with RESERVATIONS_LOCK:
            r = reservations_in(self.ec2_backend.account_id, self.ec2_backend.region_name).get(rid)
            if r and r["State"] == "active":
                r["AvailableInstanceCount"] = min(r["AvailableInstanceCount"] + 1, r["TotalInstanceCount"])
    return previous


# The AWS Price List API: GetProducts over EC2's compute products.
PRICE_LIST_ENDPOINTS = {"us-east-1", "eu-central-1", "ap-south-1"}
PRICE_LIST_LOCK = threading.Lock()
# region -> instance type -> on-demand $/h (Linux, shared tenancy).
PRICE_LIST = {}
# The products built from PRICE_LIST, rebuilt when it changes.
PRICE_PRODUCTS = []
# What AWS calls the regions the fake prices, and the usage-type prefix of each.
PRICE_LIST_REGIONS = {"us-east-1": ("US East (N. Virginia)", ""), "eu-west-1": ("EU (Ireland)", "EU-")}
# Published eu-west-1 Linux on-demand prices; other types are derived from us-east-1's.
EU_WEST_1_PUBLISHED = {"m5.large": 0.107, "m5.xlarge": 0.214, "m5.2xlarge": 0.428, "c5.large": 0.096,
                       "c5.xlarge": 0.192, "t3.medium": 0.0456, "t3.large": 0.0912, "r5.large": 0.141}
FILTER_TYPES = ["TERM_MATCH", "EQUALS", "CONTAINS", "ANY_OF", "NONE_OF"]
BUNDLED_PRICES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                              "ec2-on-demand-prices-us-east-1.json")


def seed_price_list():
    with open(BUNDLED_PRICES) as f:
        us = json.load(f)["prices"]
    eu = {t: round(p * 1.115, 4) for t, p in us.items()}
    eu.update(EU_WEST_1_PUBLISHED)
    with PRICE_LIST_LOCK:
        PRICE_LIST.clear()
        PRICE_LIST["us-east-1"] = dict(us)
        PRICE_LIST["eu-west-1"] = eu
        PRICE_PRODUCTS.clear()


def sku(*parts):
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:16].upper()


def price_products():
    """Every product of every priced region: (attributes, product family, $/h)."""
    with PRICE_LIST_LOCK:
        if not PRICE_PRODUCTS:
            PRICE_PRODUCTS.extend(build_price_products(PRICE_LIST))
        return list(PRICE_PRODUCTS)


def build_price_products(priced):
    out = []
    for region, prices in sorted(priced.items()):
        location, prefix = PRICE_LIST_REGIONS.get(region, (region, region.upper() + "-"))
        for itype, price in sorted(prices.items()):
            metal = itype.endswith(".metal") or ".metal-" in itype
            family = "Compute Instance (bare metal)" if metal else "Compute Instance"
            # The Price List lists bare metal Linux as dedicated tenancy.
            tenancy = "Dedicated" if metal else "Shared"
            variants = [
                ("Linux", tenancy, "Used", price),
                ("Windows", tenancy, "Used", round(price + 0.046 * max(1, price / 0.096), 4)),
                ("Linux", tenancy, "UnusedCapacityReservation", price),
            ]
            if not metal:
                variants.append(("Linux", "Dedicated", "Used", round(price * 1.1, 4)))
            for os_name, ten, capacity, p in variants:
                usage = ("DedicatedUsage" if ten == "Dedicated" else "BoxUsage") + f":{itype}"
                attributes = {
                    "servicecode": "AmazonEC2", "servicename": "Amazon Elastic Compute Cloud",
                    "location": location, "locationType": "AWS Region", "regionCode": region,
                    "instanceType": itype, "instanceFamily": "General purpose",
                    "currentGeneration": "Yes", "operatingSystem": os_name, "tenancy": ten,
                    "capacitystatus": capacity, "preInstalledSw": "NA", "licenseModel": "No License required",
                    "marketoption": "OnDemand", "usagetype": prefix + usage,
                    "operation": "RunInstances" if os_name == "Linux" else "RunInstances:0002",
                    "availabilityzone": "NA", "processorArchitecture": "64-bit",
                }
                out.append((attributes, family, p))
    return out


def price_document(attributes, family, price):
    """One PriceList entry as AWS answers it: a JSON document, as a string."""
    code = sku(attributes["regionCode"], attributes["instanceType"], attributes["operatingSystem"],
               attributes["tenancy"], attributes["capacitystatus"])
    od, rate = "JRTCKXETXF", "6YS6EN2CT7"
    hourly = "$%.4f per On Demand %s %s Instance Hour" % (price, attributes["operatingSystem"],
                                                         attributes["instanceType"])
    doc = {
        "product": {"productFamily": family, "attributes": attributes, "sku": code},
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {f"{code}.{od}": {
                "priceDimensions": {f"{code}.{od}.{rate}": {
                    "unit": "Hrs", "endRange": "Inf", "description": hourly, "appliesTo": [],
                    "rateCode": f"{code}.{od}.{rate}", "beginRange": "0",
                    "pricePerUnit": {"USD": "%.10f" % price}}},
                "sku": code, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": od,
                "termAttributes": {}}},
            "Reserved": {f"{code}.4NA7Y494T4": {
                "priceDimensions": {f"{code}.4NA7Y494T4.6YS6EN2CT7": {
                    "unit": "Hrs", "endRange": "Inf", "description": "Linux reserved, 1 yr, no upfront",
                    "appliesTo": [], "rateCode": f"{code}.4NA7Y494T4.6YS6EN2CT7", "beginRange": "0",
                    "pricePerUnit": {"USD": "%.10f" % (price * 0.62)}}},
                "sku": code, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "4NA7Y494T4",
                "termAttributes": {"LeaseContractLength": "1yr", "OfferingClass": "standard",
                                   "PurchaseOption": "No Upfront"}}},
        },
        "version": "20261101000000",
        "publicationDate": "2026-11-01T00:00:00Z",
    }
    return json.dumps(doc, separators=(",", ":"))


class PriceListError(Exception):
    def __init__(self, code, message, status=400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def validation(value, where, constraint):
    return PriceListError("ValidationException",
                          f"1 validation error detected: Value {value} at '{where}' failed to satisfy "
                          f"constraint: {constraint}")


def checked_filters(filters):
    if not isinstance(filters, list):
        raise validation("null", "filters", "Member must be a list")
    if len(filters) > 50:
        raise validation(f"'{filters}'", "filters", "Member must have length less than or equal to 50")
    out = []
    for i, f in enumerate(filters, 1):
        for member in ("Type", "Field", "Value"):
            v = f.get(member)
            where = f"filters.{i}.member.{member[0].lower() + member[1:]}"
            if v is None:
                raise validation("null", where, "Member must not be null")
            if member != "Type" and not 1 <= len(v) <= 1024:
                raise validation(f"'{v}'", where, "Member must have length greater than or equal to 1")
        if f["Type"] not in FILTER_TYPES:
            raise validation(f"'{f['Type']}'", f"filters.{i}.member.type",
                             "Member must satisfy enum value set: [" + ", ".join(FILTER_TYPES) + "]")
        out.append((f["Type"], f["Field"], f["Value"]))
    return out


def matches(attributes, family, service_code, filters):
    product = dict(attributes, productFamily=family, ServiceCode=service_code)
    for kind, field, value in filters:
        if field not in product:
            continue  # AWS ignores a filter on a field no product has
        have = product[field]
        values = [v.strip() for v in value.split(",")]
        ok = {
            "TERM_MATCH": have == value,
            "EQUALS": have == value,
            "CONTAINS": value in have,
            "ANY_OF": have in values,
            "NONE_OF": have not in values,
        }[kind]
        if not ok:
            return False
    return True


def get_products(request):
    service = request.get("ServiceCode")
    if not service:
        raise PriceListError("InvalidParameterException",
                             "Input Parameters are invalid. serviceCode cannot be null or empty")
    fmt = request.get("FormatVersion", "aws_v1")
    if fmt != "aws_v1":
        raise PriceListError("InvalidParameterException", f"Input Parameters are invalid. Invalid formatVersion {fmt}")
    limit = request.get("MaxResults", 100)
    if not isinstance(limit, int) or not 1 <= limit <= 100:
        raise validation(f"'{limit}'", "maxResults", "Member must have value between 1 and 100")
    filters = checked_filters(request.get("Filters") or [])
    query = hashlib.sha256(json.dumps([service, filters, limit]).encode()).hexdigest()[:16]
    offset = 0
    token = request.get("NextToken")
    if token is not None:
        try:
            q, offset = base64.b64decode(token.encode(), validate=True).decode().split(":")
            offset = int(offset)
        except Exception:
            raise PriceListError("InvalidNextTokenException", "The pagination token is invalid.")
        if q != query or offset < 0:
            raise PriceListError("InvalidNextTokenException", "The pagination token is invalid.")
    found = [] if service != "AmazonEC2" else [
        p for p in price_products() if matches(p[0], p[1], service, filters)]
    page = found[offset:offset + limit]
    answer = {"FormatVersion": "aws_v1", "PriceList": [price_document(*p) for p in page]}
    if offset + limit < len(found):
        answer["NextToken"] = base64.b64encode(f"{query}:{offset + limit}".encode()).decode()
    return answer


def price_list_app(environ, start_response):
    """The Price List API's JSON 1.1 protocol for the operations nodesmith calls."""
    def reply(status, doc):
        body = json.dumps(doc).encode()
        start_response(status, [("Content-Type", "application/x-amz-json-1.1"),
                                ("Content-Length", str(len(body)))])
        return [body]

    auth = environ.get("HTTP_AUTHORIZATION", "")
    scope = re.search(r"Credential=[^/]+/\d+/([^/]+)/([^/]+)/aws4_request", auth)
    if not scope or scope.group(2) != "pricing":
        return reply("400 Bad Request", {"__type": "IncompleteSignatureException",
                                         "message": "Authorization header requires a pricing credential scope"})
    if scope.group(1) not in PRICE_LIST_ENDPOINTS:
        # In AWS there is no such host (api.pricing.<region>.amazonaws.com): nothing answers.
        return reply("404 Not Found", {"__type": "EndpointNotFound",
                                       "message": f"the Price List API has no endpoint in {scope.group(1)}"})
    operation = environ["HTTP_X_AMZ_TARGET"].split(".", 1)[1]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    try:
        request = json.loads(environ["wsgi.input"].read(length) or b"{}")
    except ValueError:
        return reply("400 Bad Request", {"__type": "SerializationException", "Message": "not JSON"})
    if operation != "GetProducts":
        return reply("400 Bad Request", {"__type": "UnknownOperationException", "Message": operation})
    try:
        return reply("200 OK", get_products(request))
    except PriceListError as e:
        return reply(f"{e.status} Bad Request", {"__type": e.code, "Message": e.message})


def set_prices(spec):
    region, prices = spec["region"], spec["prices"]
    with PRICE_LIST_LOCK:
        PRICE_LIST.setdefault(region, {}).update({t: float(p) for t, p in prices.items()})
        PRICE_PRODUCTS.clear()

PLACEMENT_GROUPS = {}
PLACEMENT_GROUPS_LOCK = threading.Lock()
PLACEMENT_GROUP_FILTERS = {"group-name": "GroupName", "group-arn": "GroupArn", "state": "State",
                           "strategy": "Strategy", "spread-level": "SpreadLevel"}


def placement_group_values(g, name):
    """The values of a group a filter tests; None for a filter EC2 lacks."""
    if name == "tag-key":
        return [t["Key"] for t in g["Tags"]]
    if name.startswith("tag:"):
        return [t["Value"] for t in g["Tags"] if t["Key"] == name[4:]]
    if name not in PLACEMENT_GROUP_FILTERS:
        return None
    value = g.get(PLACEMENT_GROUP_FILTERS[name])
    return [] if value is None else [str(value)]


def create_placement_group(self):
    """CreatePlacementGroup: a named group of a strategy, available at once."""
    name = self._get_param("GroupName")
    if not name:
        raise MissingParameterError("GroupName")
    strategy = self._get_param("Strategy") or "cluster"
    if strategy not in ec2_enum("PlacementStrategy"):
        raise invalid(f"Invalid value '{strategy}' for Strategy.")
    spread_level = self._get_param("SpreadLevel")
    if spread_level and strategy != "spread":
        raise invalid("SpreadLevel is only valid for spread placement groups.")
    partitions = self._get_int_param("PartitionCount")
    if partitions is not None and (strategy != "partition" or not 1 <= partitions <= 7):
        raise invalid(f"Invalid value '{partitions}' for PartitionCount.")
    tags = self._parse_tag_specification("placement-group").get("placement-group", {})
    self.error_on_dryrun()
    account, region = self.current_account, self.region
    with PLACEMENT_GROUPS_LOCK:
        groups = PLACEMENT_GROUPS.setdefault((account, region), {})
        if name in groups:
            raise EC2ClientError("InvalidPlacementGroup.Duplicate",
                                 f"The placement group '{name}' already exists.")
        gid = random_id("pg")
        g = {
            "GroupName": name,
            "State": "available",
            "Strategy": strategy,
            "GroupId": gid,
            "GroupArn": f"arn:{get_partition(region)}:ec2:{region}:{account}:placement-group/{name}",
            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
        }
        if strategy == "partition":
            g["PartitionCount"] = partitions or 2
        if strategy == "spread":
            g["SpreadLevel"] = spread_level or "rack"
        groups[name] = g
        return ActionResult({"PlacementGroup": dict(g)})


def describe_placement_groups(self):
    """DescribePlacementGroups: names or ids (each must exist), then filters, ANDed."""
    names = self._get_param("GroupNames", [])
    ids = self._get_param("GroupIds", [])
    filters = self._filters_from_querystring()
    for name in filters:
        if placement_group_values({"Tags": []}, name) is None:
            raise invalid(f"The filter '{name}' is invalid")
    self.error_on_dryrun()
    with PLACEMENT_GROUPS_LOCK:
        groups = list(PLACEMENT_GROUPS.get((self.current_account, self.region), {}).values())
    for n in names:
        if not any(g["GroupName"] == n for g in groups):
            raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{n}' is unknown.")
    for i in ids:
        if not any(g["GroupId"] == i for g in groups):
            raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{i}' is unknown.")
    found = [dict(g) for g in groups
             if (not names or g["GroupName"] in names) and (not ids or g["GroupId"] in ids)]
    for name, patterns in filters.items():
        regexes = [re.compile(simple_aws_filter_to_re(p)) for p in patterns]
        found = [g for g in found
                 if any(x.match(v) for v in placement_group_values(g, name) for x in regexes)]
    return ActionResult({"PlacementGroups": found})


# ARC zonal shift: managed resources by ARN, each with its shifts.
ARC_LOCK = threading.Lock()
ARC_RESOURCES = {}
ARC_SHIFT_STATUSES = {"ACTIVE", "EXPIRED", "CANCELED"}
ARC_APPLIED = {"APPLIED", "NOT_APPLIED"}
ARC_SHIFT_TYPES = {"ZONAL_SHIFT", "PRACTICE_RUN", "FIS_EXPERIMENT", "ZONAL_AUTOSHIFT"}
ARC_ARN = re.compile(r"arn:aws:[a-z0-9-]+:([a-z0-9-]+):\d{12}:.+")


def signing_service(environ):
    scope = re.search(r"Credential=[^/]+/\d+/[^/]+/([^/]+)/aws4_request", environ.get("HTTP_AUTHORIZATION", ""))
    return scope.group(1) if scope else None


def arc_region(arn):
    m = ARC_ARN.fullmatch(arn)
    if not m:
        raise ValueError(f"not a resource ARN: {arn}")
    return m.group(1)


def arc_zone_ids(region):
    return [z.zone_id for z in ec2_backends[DEFAULT_ACCOUNT_ID][region].describe_availability_zones()]


def register_arc_resource(spec):
    arn = spec["arn"]
    region = arc_region(arn)
    with ARC_LOCK:
        ARC_RESOURCES[arn] = {"name": spec.get("name", arn.rsplit("/", 1)[-1]), "region": region,
                              "shifts": [], "autoshifts": []}


def arc_resource(arn):
    r = ARC_RESOURCES.get(arn)
    if r is None:
        raise ValueError(f"{arn} is not an ARC managed resource (register it with arc-resource)")
    return r


def checked_away_from(r, zone_id):
    if zone_id not in arc_zone_ids(r["region"]):
        raise ValueError(f"{zone_id} is not a zone id of {r['region']}")
    return zone_id


def seed_zonal_shift(spec):
    now = datetime.now(timezone.utc)
    if "expiryTime" in spec:
        expiry = parse_timestamp(spec["expiryTime"])
    else:
        expiry = now + timedelta(seconds=int(spec.get("expiresIn", 3600)))
    status = spec.get("status", "ACTIVE")
    applied = spec.get("appliedStatus", "APPLIED")
    shift_type = spec.get("shiftType", "ZONAL_SHIFT")
    if status not in ARC_SHIFT_STATUSES or applied not in ARC_APPLIED or shift_type not in ARC_SHIFT_TYPES:
        raise ValueError(f"bad status, appliedStatus or shiftType: {spec}")
    with ARC_LOCK:
        r = arc_resource(spec["resource"])
        r["shifts"].append({
            "zonalShiftId": spec.get("id") or str(uuid.uuid4()),
            "resourceIdentifier": spec["resource"],
            "awayFrom": checked_away_from(r, spec["awayFrom"]),
            "startTime": now, "expiryTime": expiry, "status": status, "appliedStatus": applied,
            "shiftType": shift_type, "comment": spec.get("comment", "seeded by the test harness")})


def seed_autoshift(spec):
    applied = spec.get("appliedStatus", "APPLIED")
    if applied not in ARC_APPLIED:
        raise ValueError(f"bad appliedStatus: {applied}")
    with ARC_LOCK:
        r = arc_resource(spec["resource"])
        r["autoshifts"].append({"awayFrom": checked_away_from(r, spec["awayFrom"]), "appliedStatus": applied,
                                "startTime": datetime.now(timezone.utc)})


def epoch(t):
    return t.timestamp()


class ArcError(Exception):
    def __init__(self, code, message, status):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def get_managed_resource(identifier):
    if not 8 <= len(identifier) <= 1024:
        raise ArcError("ValidationException",
                             f"1 validation error detected: Value '{identifier}' at 'resourceIdentifier' failed to "
                             "satisfy constraint: Member must have length between 8 and 1024", 400)
    now = datetime.now(timezone.utc)
    with ARC_LOCK:
        r = ARC_RESOURCES.get(identifier)
        if r is None:
            raise ArcError("ResourceNotFoundException",
                                 f"The resource {identifier} was not found or is not supported by zonal shift", 404)
        active = [s for s in r["shifts"] if s["status"] == "ACTIVE" and s["expiryTime"] > now]
        away = {s["awayFrom"] for s in active if s["appliedStatus"] == "APPLIED"}
        away |= {a["awayFrom"] for a in r["autoshifts"] if a["appliedStatus"] == "APPLIED"}
        return {
            "arn": identifier,
            "name": r["name"],
            "appliedWeights": {z: 0.0 if z in away else 1.0 for z in arc_zone_ids(r["region"])},
            "zonalShifts": [{
                "appliedStatus": s["appliedStatus"], "zonalShiftId": s["zonalShiftId"],
                "resourceIdentifier": s["resourceIdentifier"], "awayFrom": s["awayFrom"],
                "expiryTime": epoch(s["expiryTime"]), "startTime": epoch(s["startTime"]),
                "comment": s["comment"], "shiftType": s["shiftType"]} for s in active],
            "autoshifts": [{"appliedStatus": a["appliedStatus"], "awayFrom": a["awayFrom"],
                            "startTime": epoch(a["startTime"])} for a in r["autoshifts"]],
            "zonalAutoshiftStatus": "ENABLED" if r["autoshifts"] else "DISABLED",
        }


def arc_app(environ, start_response):
    """ARC zonal shift's REST JSON protocol for the operations nodesmith calls."""
    def reply(status, doc, error=None):
        body = json.dumps(doc).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if error:
            headers.append(("x-amzn-ErrorType", error))
        start_response(status, headers)
        return [body]

    # The identifier is one URI label (an ARN's slashes arrive percent-encoded),
    # so the route is read from the raw path, before any decoding.
    path = (environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "")).split("?", 1)[0]
    prefix = "/managedresources/"
    label = path[len(prefix):]
    if environ.get("REQUEST_METHOD") != "GET" or not path.startswith(prefix) or not label or "/" in label:
        return reply("404 Not Found", {"message": f"no operation at {environ.get('REQUEST_METHOD')} {path}"},
                     "UnknownOperationException")
    try:
        return reply("200 OK", get_managed_resource(unquote(label)))
    except ArcError as e:
        status = {400: "400 Bad Request", 404: "404 Not Found"}[e.status]
        return reply(status, {"message": e.message}, e.code)


def status_summary(check):
    """An Instance's InstanceStatus or SystemStatus, failed while seeded impaired."""
    def summary(self):
        if self.state_code != 16:
            return {"Status": "not-applicable"}
        with IMPAIRED_LOCK:
            bad = IMPAIRED.get(self.id)
        if bad and check in bad["checks"]:
            return {"Status": "impaired", "Details": [
                {"Name": "reachability", "Status": "failed", "ImpairedSince": bad["since"]}]}
        return {"Status": "ok", "Details": [{"Name": "reachability", "Status": "passed"}]}
    return property(summary)


def seed_impaired(spec):
    """The `impaired` command: the named checks of a running instance fail."""
    unknown = set(spec) - {"instanceId", "checks", "since", "region"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    region = spec.get("region", REGION)
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][region]
    instance = backend.get_instance(spec["instanceId"])
    checks = set(spec.get("checks", ["system"]))
    if not checks or not checks <= STATUS_CHECKS:
        raise ValueError(f"checks must be a non-empty subset of {sorted(STATUS_CHECKS)}")
    since = spec.get("since")
    if since:
        since = datetime.fromisoformat(since)
        if since.tzinfo is None:
            raise ValueError("since needs a timezone (e.g. a trailing Z)")
        since = since.astimezone(timezone.utc)
    else:
        since = datetime.now(timezone.utc).replace(microsecond=0)
    with IMPAIRED_LOCK:
        IMPAIRED[instance.id] = {"checks": checks, "since": since}


def answered_once(action):
    """`action` (an EC2Response method whose answer depends only on the
    region and the query) with its answers serialised once each: moto
    serialises its ~1,400 instance types (and their ~8,000 zonal offerings)
    anew for every call, which was most of its time in the test suite (every
    test's first solve reads the catalog). They never change while it runs."""
    answers = {}
    lock = threading.Lock()

    @functools.wraps(action)
    def answer(self):
        key = (self.region, tuple(sorted((k, tuple(v)) for k, v in self.querystring.items())))
        with lock:
            known = answers.get(key)
        if known is None:
            status, headers, body = self.serialized(action(self))
            known = (status, dict(headers), body)
            if status == 200:
                with lock:
                    answers[key] = known
        status, headers, body = known
        return status, dict(headers), body

    return answer


def own_tags(self):
    """A resource's tags from the tag store's entry for it, in the shape and
    order moto's get_tags gives. moto's own reads them through
    DescribeTags' filter, a scan of every tag of every resource, and calls it
    twice per instance a DescribeInstances filters by tag and answers with:
    at 5,000 instances one DescribeInstances took 75 s (EC2 answers it in
    seconds). A resource id has no wildcard, so the filter matched this one
    entry."""
    if not self.id:
        return []
    kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(self.id), "")
    return [{"resource_id": self.id, "key": k, "value": v, "resource_type": kind}
            for k, v in self.ec2_backend.tags.get(self.id, {}).items()]


class QueriedTable:
    """A DynamoDB table as one Query sees it: every attribute and method is
    the table's, but its items are only those the Query can match."""

    def __init__(self, table, items):
        self._table = table
        self._items = items

    def __getattr__(self, name):
        return getattr(self._table, name)

    def all_items(self):
        return self._items


def partition_query(query):
    """Table.query over the items it can match. moto's own walks every item
    of the table, sorted by key, for each Query; with the lock that keeps its
    writes atomic, every state-table call waited behind those walks (at
    5,000 claims a spot storm's 800 PutItems averaged 0.2 s each). A table
    Query matches one partition; an index Query is sorted by the index's keys
    after, so the items' order going in does not change the answer."""

    def partitioned(self, hash_key, range_comparison, range_objs, limit, exclusive_start_key,
                    scan_index_forward, projection_expressions, index_name=None, *rest, **kwargs):
        ranged = bool(self.range_key_attr)
        if index_name is None:
            found = self.items.get(hash_key)
            if found is None:
                items = []
            else:
                items = list(found.values()) if ranged else [found]
        else:
            items = [i for p in self.items.values() for i in (p.values() if ranged else [p])]
        return query(QueriedTable(self, items), hash_key, range_comparison, range_objs, limit,
                     exclusive_start_key, scan_index_forward, projection_expressions, index_name,
                     *rest, **kwargs)

    return partitioned


SQS_UNCOUNTED = threading.local()


def uncounted_queue(count):
    """A queue's message count, 0 while a send or a receive reads the
    queue's attributes. moto's SendMessage reads every attribute of the queue
    to learn whether it de-duplicates by content, and its ReceiveMessage
    reads them for the retention period of each message it hands out; each
    read counts the queue's messages three times. With 20,000 pending pods
    queued, a SendMessageBatch took seconds and moto spent nine tenths of a
    burst there (SQS's sends and receives do not slow as a queue grows).
    Neither reads the counts, and GetQueueAttributes still counts."""

    def counted(self):
        return 0 if getattr(SQS_UNCOUNTED, "on", False) else count.fget(self)

    return property(counted)


def without_counts(step):
    """`step` with the queue's message counts left uncounted (see `uncounted_queue`)."""

    @functools.wraps(step)
    def uncounted(*args, **kwargs):
        before = getattr(SQS_UNCOUNTED, "on", False)
        SQS_UNCOUNTED.on = True
        try:
            return step(*args, **kwargs)
        finally:
            SQS_UNCOUNTED.on = before

    return uncounted


def visible_messages(self):
    """The messages a receive can take: those visible and not delayed, as
    moto's `Queue.messages` finds them, with one reading of the clock for
    the whole queue instead of two per message."""
    now = unix_time_millis()
    return [m for m in self._messages if now > m.visible_at and not now < m.delayed_until]


# Every receipt handle handed out, to the message it was handed out with.
SQS_RECEIPTS = weakref.WeakValueDictionary()


def receipt_indexed(mark_received):
    """Message.mark_received that also files the new receipt handle."""

    @functools.wraps(mark_received)
    def marked(self, *args, **kwargs):
        mark_received(self, *args, **kwargs)
        SQS_RECEIPTS[self.receipt_handle] = self

    return marked


class QueueMessages(list):
    """A queue's messages. moto's ReceiveMessage moves a message received
    too often to the dead-letter queue by removing it from a snapshot's
    list; a receive or a delete on another thread may have removed it
    first, and moto then answered the receive with an error (SQS never
    does). Removing a message no longer there is a no-op."""

    def remove(self, message):
        self.discard(message)

    def discard(self, message):
        """Removes `message` in place (a message appended meanwhile stays);
        whether it was there."""
        try:
            super().remove(message)
        except ValueError:
            return False
        return True


def tolerant_queue(init):
    """Queue.__init__ that keeps its messages in a `QueueMessages`."""

    @functools.wraps(init)
    def made(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._messages = QueueMessages(self._messages)

    return made


def delete_by_receipt(delete):
    """Queue.delete_message that finds the message by its receipt handle.
    moto's walks the queue twice and builds each message's list of handles
    on the way (tens of milliseconds a delete at 20,000 messages), and
    rebuilds the queue's list, losing a message sent meanwhile. A handle
    not filed, already deleted, or of a message gone goes to moto's own (its
    errors)."""

    @functools.wraps(delete)
    def deleting(self, receipt_handle):
        message = SQS_RECEIPTS.get(receipt_handle)
        if message is None or receipt_handle in self.deleted_messages:
            return delete(self, receipt_handle)
        if not self._messages.discard(message):
            delete(self, receipt_handle)
            self._messages = QueueMessages(self._messages)
            return None
        self.pending_messages.discard(message)
        self.deleted_messages.update(message.all_receipt_handles)
        return None

    return deleting


def describe_instance_status(self):
    """DescribeInstanceStatus in pages, as EC2 answers it."""
    instance_ids = self._get_param("InstanceIds", [])
    include_all = self._get_bool_param("IncludeAllInstances", False)
    max_results = self._get_int_param("MaxResults")
    token = self._get_param("NextToken")
    if max_results is not None and instance_ids:
        raise EC2ClientError("InvalidParameterCombination",
                             "The parameter instancesSet cannot be used with the parameter maxResults")
    if max_results is not None and not 5 <= max_results <= 1000:
        raise EC2ClientError("InvalidParameterValue",
                             f"Value ( {max_results} ) for parameter maxResults is invalid. "
                             "Expecting a value greater than 5.")
    if token is not None and not re.fullmatch(r"i-[0-9a-f]+", token):
        raise EC2ClientError("InvalidParameterValue", f"Invalid value '{token}' for nextToken")
    filters = [{"name": k, "values": v} for k, v in self._filters_from_querystring().items()]
    found = sorted(self.ec2_backend.describe_instance_status(instance_ids, include_all, filters),
                   key=lambda i: i.id)
    if token is not None:
        # The token is the first id of the next page: an instance gone since does not break it.
        found = [i for i in found if i.id >= token]
    result = {"InstanceStatuses": found}
    if max_results is not None and len(found) > max_results:
        result = {"InstanceStatuses": found[:max_results], "NextToken": found[max_results].id}
    return ActionResult(result)


def main():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # moto lists its package's folders on every request to route it; they
    # do not change while it runs.
    modules = tuple(moto_backends.list_of_moto_modules())
    moto_backends.list_of_moto_modules = lambda: modules
    threaded_moto_server.DomainDispatcherApplication = AtomicDynamoDB
    spot_instances.SpotInstances.describe_spot_price_history = describe_spot_price_history
    Fleet.__init__ = fleet_init
    fleet_responses.Fleets.create_fleet = create_fleet_response
    Instance.terminate = instance_terminate
    TaggedEC2Resource.get_tags = own_tags
    DynamoTable.query = partition_query(DynamoTable.query)
    for count in ("approximate_number_of_messages", "approximate_number_of_messages_delayed",
                  "approximate_number_of_messages_not_visible"):
        setattr(SqsQueue, count, uncounted_queue(getattr(SqsQueue, count)))
    SQSBackend.send_message = without_counts(SQSBackend.send_message)
    SqsQueue.messages = property(visible_messages)
    SqsMessage.mark_received = receipt_indexed(SqsMessage.mark_received)
    SqsQueue.delete_message = delete_by_receipt(SqsQueue.delete_message)
    SqsQueue.__init__ = tolerant_queue(SqsQueue.__init__)
    SQSBackend.is_message_valid_based_on_retention_period = without_counts(
        SQSBackend.is_message_valid_based_on_retention_period)
    Instance.instance_status = status_summary("instance")
    Instance.system_status = status_summary("system")
    EC2Response.describe_instance_status = describe_instance_status
    EC2Response.describe_instance_types = answered_once(EC2Response.describe_instance_types)
    EC2Response.describe_instance_type_offerings = answered_once(EC2Response.describe_instance_type_offerings)
    EC2Response.create_capacity_reservation = create_capacity_reservation
    EC2Response.describe_capacity_reservations = describe_capacity_reservations
    EC2Response.cancel_capacity_reservation = cancel_capacity_reservation
    EC2Response.create_placement_group = create_placement_group
    EC2Response.describe_placement_groups = describe_placement_groups
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
                with RESERVATIONS_LOCK:
                    RESERVATIONS.clear()
                with PLACEMENT_GROUPS_LOCK:
                    PLACEMENT_GROUPS.clear()
                with ARC_LOCK:
                    ARC_RESOURCES.clear()
                with IMPAIRED_LOCK:
                    IMPAIRED.clear()
                seed()
            elif cmd == "param":
                name, _, value = arg.partition(" ")
                set_public_parameter(name, value)
            elif cmd == "reservation":
                seed_reservation(json.loads(arg))
            elif cmd == "impaired":
                seed_impaired(json.loads(arg))
            elif cmd == "prices":
                set_prices(json.loads(arg))
            elif cmd == "arc-resource":
                register_arc_resource(json.loads(arg))
            elif cmd == "zonal-shift":
                seed_zonal_shift(json.loads(arg))
            elif cmd == "autoshift":
                seed_autoshift(json.loads(arg))
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
