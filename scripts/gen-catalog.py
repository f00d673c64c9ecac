#!/usr/bin/env python3
"""Generate the built-in instance catalog snapshot (shared/data/catalog-<region>.json).

Inputs:
  * moto's bundled real EC2 data: DescribeInstanceTypes output
    (moto/ec2/resources/instance_types.json.gz) and availability-zone
    instance type offerings (instance_type_offerings/availability-zone/<region>.json.gz);
  * an on-demand price table ({"prices": {"m5.large": 0.096, ...}});
  * a supplement of hand-written facts for priced types moto lacks.

Only Linux-capable types (x86_64 or arm64) with an on-demand price are kept.
Spot prices are ESTIMATES: a deterministic fraction (30-50 %) of the on-demand
price per type and zone, and the snapshot says so with
"spotPricesAreEstimates": true.

The facts mapping here must match `ec2::facts_from_sdk` in
shared/src/catalog/ec2.rs, so the snapshot and a live EC2 catalog agree.

Usage:
  .venv/bin/python scripts/gen-catalog.py [--prices shared/data/ec2-on-demand-prices-us-east-1.json]
      [--supplement shared/data/catalog-supplement-us-east-1.json] [--out shared/data/catalog-us-east-1.json]
"""

import argparse
import gzip
import hashlib
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def round_half_up(x):
    return int(math.floor(x + 0.5))


def default_card_enis(net):
    """Network interfaces of the default network card (pods get addresses
    there only); the instance's total when EC2 lists no cards."""
    index = net.get("DefaultNetworkCardIndex", 0)
    for card in net.get("NetworkCards", []):
        if card.get("NetworkCardIndex") == index and card.get("MaximumNetworkInterfaces") is not None:
            return card["MaximumNetworkInterfaces"]
    return net.get("MaximumNetworkInterfaces", 0)


def facts_from_describe(t):
    """DescribeInstanceTypes entry -> Ec2Facts (camelCase, defaults omitted)."""
    proc = t.get("ProcessorInfo", {})
    net = t.get("NetworkInfo", {})
    ebs = t.get("EbsInfo", {}).get("EbsOptimizedInfo", {})
    storage = t.get("InstanceStorageInfo")
    f = {
        "name": t["InstanceType"],
        "vcpus": t["VCpuInfo"]["DefaultVCpus"],
        "memoryMib": t["MemoryInfo"]["SizeInMiB"],
        "architectures": proc.get("SupportedArchitectures", []),
    }
    if proc.get("Manufacturer"):
        f["cpuManufacturer"] = proc["Manufacturer"]
    if proc.get("SustainedClockSpeedInGhz") is not None:
        f["clockGhz"] = proc["SustainedClockSpeedInGhz"]
    if t.get("Hypervisor"):
        f["hypervisor"] = t["Hypervisor"]
    if t.get("BareMetal"):
        f["bareMetal"] = True
    f["maxEnis"] = default_card_enis(net)
    f["ipv4PerEni"] = net.get("Ipv4AddressesPerInterface", 0)
    cards = [c["BaselineBandwidthInGbps"] for c in net.get("NetworkCards", []) if c.get("BaselineBandwidthInGbps") is not None]
    if cards:
        f["networkBandwidthMbps"] = sum(round_half_up(g * 1000) for g in cards)
    if ebs.get("MaximumBandwidthInMbps") is not None:
        f["ebsBandwidthMbps"] = ebs["MaximumBandwidthInMbps"]
    if storage and storage.get("TotalSizeInGB") is not None:
        f["localStorageGb"] = storage["TotalSizeInGB"]
        if storage.get("NvmeSupport") in ("required", "supported"):
            f["localNvme"] = True
    gpus = [device(g) for g in t.get("GpuInfo", {}).get("Gpus", [])]
    if gpus:
        f["gpus"] = gpus
    # Neuron devices (Inferentia, Trainium) carry core counts; older data
    # has only InferenceAcceleratorInfo.
    neuron = t.get("NeuronInfo", {}).get("NeuronDevices", [])
    if neuron:
        f["accelerators"] = [neuron_device(d) for d in neuron]
    else:
        acc = [device(a) for a in t.get("InferenceAcceleratorInfo", {}).get("Accelerators", [])]
        if acc:
            f["accelerators"] = acc
    efa = net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0) if net.get("EfaSupported") else 0
    if efa:
        f["efaInterfaces"] = efa
    if net.get("EncryptionInTransitSupported"):
        f["encryptionInTransit"] = True
    f["usageClasses"] = t.get("SupportedUsageClasses", [])
    return f


def device(d):
    out = {"name": d.get("Name", ""), "manufacturer": d.get("Manufacturer", ""), "count": d.get("Count", 0)}
    mem = d.get("MemoryInfo", {}).get("SizeInMiB")
    if mem is not None:
        out["memoryMib"] = mem
    return out


def neuron_device(d):
    out = {"name": d.get("Name", ""), "manufacturer": "AWS", "count": d.get("Count", 0)}
    mem = d.get("MemoryInfo", {}).get("SizeInMiB")
    if mem is not None:
        out["memoryMib"] = mem
    cores = d.get("CoreInfo", {}).get("Count")
    if cores is not None:
        out["cores"] = cores
    return out


def spot_estimate(name, zone, on_demand):
    """A deterministic 30-50 % of on-demand per type and zone (an estimate, not a market price)."""
    h = int(hashlib.sha256(f"{name}/{zone}".encode()).hexdigest()[:8], 16)
    fraction = 0.30 + (h % 21) / 100.0
    return max(round(on_demand * fraction, 4), 0.0001)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--prices", default=os.path.join(REPO, "shared/data/ec2-on-demand-prices-us-east-1.json"))
    ap.add_argument("--supplement", default=os.path.join(REPO, "shared/data/catalog-supplement-us-east-1.json"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import moto  # noqa: PLC0415 (only needed for its data files)

    res = os.path.join(os.path.dirname(moto.__file__), "ec2", "resources")
    with gzip.open(os.path.join(res, "instance_types.json.gz"), "rt") as fh:
        described = json.load(fh)
    with gzip.open(os.path.join(res, "instance_type_offerings", "availability-zone", f"{args.region}.json.gz"), "rt") as fh:
        offerings = json.load(fh)
    with open(args.prices) as fh:
        price_table = json.load(fh)
    prices = price_table["prices"]
    with open(args.supplement) as fh:
        supplement = json.load(fh)["instanceTypes"]

    zones = {}
    for o in offerings:
        zones.setdefault(o["InstanceType"], set()).add(o["Location"])

    entries = {}
    for name, t in described.items():
        f = facts_from_describe(t)
        entries[name] = {"facts": f, "zones": sorted(zones.get(name, ()))}
    for s in supplement:
        name = s["facts"]["name"]
        if name in entries:
            sys.exit(f"supplement type {name} is already in moto's data; drop it from the supplement")
        entries[name] = {"facts": s["facts"], "zones": sorted(s["zones"])}

    out_types = []
    skipped = {"unpriced": 0, "not linux": 0, "no zones": 0}
    for name in sorted(entries):
        e = entries[name]
        f = e["facts"]
        if name not in prices:
            skipped["unpriced"] += 1
            continue
        if not any(a in ("x86_64", "arm64") for a in f["architectures"]):
            skipped["not linux"] += 1
            continue
        if not e["zones"]:
            skipped["no zones"] += 1
            continue
        od = prices[name]
        entry = {"facts": f, "zones": e["zones"], "onDemandPrice": od}
        if "spot" in f["usageClasses"]:
            entry["spotPrices"] = [spot_estimate(name, z, od) for z in e["zones"]]
        out_types.append(entry)

    snapshot = {
        "region": args.region,
        "generatedBy": "scripts/gen-catalog.py",
        "sources": {
            "instanceTypes": f"moto {moto.__version__} bundled DescribeInstanceTypes data + {os.path.basename(args.supplement)}",
            "offerings": f"moto {moto.__version__} bundled availability-zone offerings for {args.region}",
            "onDemandPrices": f"{os.path.basename(args.prices)} (as of {price_table.get('asOf', 'unknown')})",
        },
        "spotPricesAreEstimates": True,
        "spotPriceEstimate": "deterministic 30-50 % of the on-demand price per type and zone; not market data",
        "instanceTypes": out_types,
    }
    out = args.out or os.path.join(REPO, f"shared/data/catalog-{args.region}.json")
    with open(out, "w") as fh:
        # One type per line: compact to load, still diffable.
        fh.write("{\n")
        head = {k: v for k, v in snapshot.items() if k != "instanceTypes"}
        for k, v in head.items():
            fh.write(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))},\n")
        fh.write('"instanceTypes": [\n')
        fh.write(",\n".join(json.dumps(t, separators=(",", ":")) for t in out_types))
        fh.write("\n]\n}\n")
    print(f"wrote {out}: {len(out_types)} types; skipped {skipped}", file=sys.stderr)


if __name__ == "__main__":
    main()
