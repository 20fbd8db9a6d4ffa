#!/usr/bin/env python3
"""Helpers of bench/ec.sh: what the object files of a VDI take on the
nodes' disks, the nodes' /proc/PID/io counters, page cache eviction of
the object files, fio's latencies, and the report tables.

  ec.py census CLUSTER VDI_ID NODE...      JSON: the VDI's objects on those nodes
  ec.py placed CENSUS COPIES K M           "yes" when every data object is whole
                                           on distinct nodes (K=0: COPIES copies;
                                           else K+M chunks, one slot), else why not
  ec.py held CENSUS                        per node: bytes of the VDI it holds
  ec.py on CENSUS NODE                     how many objects have a copy on NODE, how
                                           many data objects a chunk
  ec.py folded A B                         how many data objects' chunks changed slot
                                           from census A to census B (were folded)
  ec.py io-snap PID...                     JSON: /proc/PID/io of each
  ec.py io-diff A B                        JSON: the sums of B - A over the pids in both
  ec.py evict CLUSTER                      drop the object files' pages from the page cache
  ec.py fio JSON                           JSON: ops, IOPS, mean, p50, p99 (µs) of fio's job
  ec.py record OUT KEY=VALUE...            append a result (values JSON when they parse)
  ec.py perf OUT FIO_JSON CPU KEY=VALUE... append a result: fio's figures, CPU per op
                                           (run_jobs' "cpu LABEL JOB US CORES")
  ec.py settle CLUSTER VDI_ID QUIET PID... -- NODE...
                                           wait until the VDI's object files stop
                                           changing and the pids are quiet
  ec.py report OUT                         the tables, from OUT/results.jsonl

Object files are CLUSTER/nodeN/objects/*/<16 hex digits>; the id's top
byte is the type (0 data, 1 map, 16..26 and 32..42 chunks of the two
slots: internal/object/id.go), then 24 bits of VDI id, then the index.
"""
import glob
import json
import os
import statistics
import sys


def kind(oid):
    t = oid >> 56
    if t == 0:
        return "data", None
    if t == 1:
        return "map", None
    if 16 <= t <= 26:
        return "chunk", (t - 16, 0)
    if 32 <= t <= 42:
        return "chunk", (t - 32, 1)
    return "other", None


def census(cluster, vdi, nodes):
    alloc = {"data": 0, "map": 0, "chunk": 0}
    files = {"data": 0, "map": 0, "chunk": 0}
    held = {}
    # data object index (map object: "map" index) ->
    # {"copies": [node...], "chunks": {"c/slot": [node...]}}
    objects = {}
    for node in nodes:
        held[node] = 0
        for path in glob.glob(os.path.join(cluster, "node%s" % node, "objects", "*", "*")):
            name = os.path.basename(path)
            if len(name) != 16:
                continue  # a temporary file
            try:
                oid = int(name, 16)
                st = os.stat(path)
            except (ValueError, OSError):
                continue
            if (oid >> 32) & 0xFFFFFF != vdi:
                continue
            k, chunk = kind(oid)
            if k == "other":
                continue
            size = st.st_blocks * 512
            alloc[k] += size
            files[k] += 1
            held[node] += size
            key = str(oid & 0xFFFFFFFF) if k != "map" else "map%d" % (oid & 0xFFFFFFFF)
            o = objects.setdefault(key, {"copies": [], "chunks": {}})
            if k in ("data", "map"):
                o["copies"].append(node)
            else:
                o["chunks"].setdefault("%d/%d" % chunk, []).append(node)
    return {"vdi": vdi, "nodes": nodes, "alloc": alloc, "files": files, "held": held, "objects": objects}


def placed(c, copies, k, m):
    """Says why the VDI's objects are not all whole on distinct nodes."""
    if not c["objects"]:
        return "no objects"
    for index, o in sorted(c["objects"].items()):
        if len(o["copies"]) != copies or len(set(o["copies"])) != copies:
            return "object %s: copies on %s, want %d" % (index, o["copies"], copies)
        if k == 0 or index.startswith("map"):
            continue
        slots = {key.split("/")[1] for key in o["chunks"]}
        homes = [n for nodes in o["chunks"].values() for n in nodes]
        if len(slots) != 1 or len(o["chunks"]) != k + m or len(homes) != k + m or len(set(homes)) != k + m:
            return "object %s: chunks %s, want %d on distinct nodes in one slot" % (index, o["chunks"], k + m)
    return "yes"


def slots(c):
    """index -> the chunk slot its chunks are in (one slot only)."""
    out = {}
    for index, o in c["objects"].items():
        s = {key.split("/")[1] for key in o["chunks"]}
        if len(s) == 1:
            out[index] = s.pop()
    return out


FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes", "cancelled_write_bytes")


def io_snap(pids):
    out = {}
    for pid in pids:
        try:
            with open("/proc/%s/io" % pid) as f:
                out[pid] = {k.strip(): int(v) for k, v in (line.split(":") for line in f)}
        except OSError:
            pass  # gone (a killed node)
    return out


def io_diff(a, b):
    d = {k: 0 for k in FIELDS}
    for pid in set(a) & set(b):
        for k in FIELDS:
            d[k] += b[pid].get(k, 0) - a[pid].get(k, 0)
    d["device_write_bytes"] = d["write_bytes"] - d["cancelled_write_bytes"]
    return d


def evict(cluster):
    n = 0
    for path in glob.glob(os.path.join(cluster, "node*", "objects", "*", "*")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return n


def fio(path):
    text = open(path).read()
    job = json.loads(text[text.index("{"):])["jobs"][0]  # after fio's "connected" lines
    rw = job["job options"].get("rw", "")
    s = job["read" if "read" in rw else "write"]
    clat = s["clat_ns"]
    pct = clat.get("percentile", {})

    def p(x):
        for k, v in pct.items():
            if abs(float(k) - x) < 1e-6:
                return v / 1000.0
        return float("nan")
    return {"ops": s["total_ios"], "iops": s["iops"], "mb_s": s["bw_bytes"] / 1e6,
            "mean_us": clat["mean"] / 1000.0, "p50_us": p(50), "p99_us": p(99),
            "runtime_s": job["job_runtime"] / 1000.0}


def record(out, pairs):
    r = {}
    for pair in pairs:
        k, v = pair.split("=", 1)
        try:
            r[k] = json.loads(v)
        except ValueError:
            r[k] = v
    with open(os.path.join(out, "results.jsonl"), "a") as f:
        f.write(json.dumps(r) + "\n")


def ratio(a, b):
    return "%.2f" % (a / b) if b else "-"


def mib(n):
    return "%.1f" % (n / 2**20)


def report(out):
    rows = [json.loads(line) for line in open(os.path.join(out, "results.jsonl"))]

    def of(item):
        return [r for r in rows if r.get("item") == item]

    space = of("space")
    if space:
        print("\n== 1. Space: allocated bytes of the VDI's object files on all nodes, after writing it whole and closing it")
        base = next((r for r in space if r["setup"] == "c3"), None)
        print("%-8s %10s %12s %10s %12s %12s %10s %10s" % ("VDI", "written", "data objs", "map", "chunks", "total", "per byte", "/copies 3"))
        for r in space:
            a = r["census"]["alloc"]
            total = sum(a.values())
            per = total / r["logical"]
            print("%-8s %8sMi %10sMi %8sMi %10sMi %10sMi %10.3f %10s" % (
                r["setup"], mib(r["logical"]), mib(a["data"]), mib(a["map"]), mib(a["chunk"]), mib(total), per,
                ratio(per, sum(base["census"]["alloc"].values()) / base["logical"]) if base else "-"))
        print("(data objs: the replicated objects, for an EC VDI its M+1 copies of overlay, entries and heads; files: %s)" %
              ", ".join("%s %s" % (r["setup"], r["census"]["files"]) for r in space))
        fills = [r for r in space if "fill" in r]
        if fills:
            print("precondition (1 MiB writes, QD16, whole VDI): " + ", ".join("%s %.0f MB/s" % (r["setup"], r["fill"]["mb_s"]) for r in fills))

    idle = next((r["cores"] for r in of("idle")), None)

    def net(r):
        """CPU per operation above the idle cluster's (µs)."""
        if idle is None or not r.get("iops"):
            return float("nan")
        return (r["cores"] - idle) * 1e6 / r["iops"]

    perf = of("perf")
    if perf:
        print("\n== 2. The shared fio jobs, means of %d rounds (IOPS; MB/s for seq*; CPU: the nodes' user+system time per operation)" %
              len({r["round"] for r in perf}))
        jobs = []
        for r in perf:
            if r["job"] not in jobs:
                jobs.append(r["job"])
        print("%-15s %9s %9s %6s  %10s %10s %6s  %10s %10s %6s  %s" % (
            "job", "copies 3", "4+2", "EC/c3", "c3 us/op", "4+2 us/op", "EC/c3", "c3 net", "4+2 net", "EC/c3", "rounds (c3 | 4+2)"))
        for job in jobs:
            def vals(setup, key):
                return [key(r) if callable(key) else r[key] for r in perf if r["job"] == job and r["setup"] == setup]
            metric = "mb_s" if job.startswith("seq") else "iops"
            a, b = vals("c3", metric), vals("ec", metric)
            if not a or not b:
                continue
            ca, cb = statistics.mean(vals("c3", "cpu_us")), statistics.mean(vals("ec", "cpu_us"))
            na, nb = statistics.mean(vals("c3", net)), statistics.mean(vals("ec", net))
            print("%-15s %9.0f %9.0f %6s  %10.1f %10.1f %6s  %10.1f %10.1f %6s  %s | %s" % (
                job, statistics.mean(a), statistics.mean(b), ratio(statistics.mean(b), statistics.mean(a)),
                ca, cb, ratio(cb, ca), na, nb, ratio(nb, na),
                " ".join("%.0f" % x for x in a), " ".join("%.0f" % x for x in b)))
        if idle is not None:
            print("(net: above the idle cluster's %.2f cores; seq*: per 1 MiB request)" % idle)
        lat = [r for r in perf if r["job"] in ("randwrite-qd1", "randread-qd1")]
        for job in ("randwrite-qd1", "randread-qd1"):
            parts = []
            for setup in ("c3", "ec"):
                rs = [r for r in lat if r["job"] == job and r["setup"] == setup]
                if rs:
                    parts.append("%s p50 %.0f p99 %.0f us" % (setup, statistics.mean(r["p50_us"] for r in rs), statistics.mean(r["p99_us"] for r in rs)))
            if parts:
                print("%s latency: %s" % (job, "; ".join(parts)))

    amp = of("amp")
    if amp:
        print("\n== 3. Small writes: 4 KiB random writes (fixed count), the nodes' /proc/PID/io per write, cold page cache at the start")
        print("%-6s %6s %7s %10s %10s %8s %8s   %12s %12s %8s %10s %10s" % (
            "VDI", "round", "writes", "dev wr/op", "dev rd/op", "syscw/op", "syscr/op",
            "fold wr", "fold rd", "folded", "wr/object", "fold wr/op"))
        for r in amp:
            w, f, n = r["write"], r["fold"], r["ops"]
            folded = r.get("folded", 0)
            print("%-6s %6s %7d %9.0fB %9.0fB %8.1f %8.1f   %10sMi %10sMi %8d %8sMi %9.0fB" % (
                r["setup"], r["round"], n, w["device_write_bytes"] / n, w["read_bytes"] / n, w["syscw"] / n, w["syscr"] / n,
                mib(f["device_write_bytes"]), mib(f["read_bytes"]), folded,
                mib(f["device_write_bytes"] / folded) if folded else "-", f["device_write_bytes"] / n))
        means = {}
        for setup in ("c3", "ec"):
            rs = [r for r in amp if r["setup"] == setup]
            if rs:
                means[setup] = {
                    "wr": statistics.mean(r["write"]["device_write_bytes"] / r["ops"] for r in rs),
                    "rd": statistics.mean(r["write"]["read_bytes"] / r["ops"] for r in rs),
                    "syscw": statistics.mean(r["write"]["syscw"] / r["ops"] for r in rs),
                    "syscr": statistics.mean(r["write"]["syscr"] / r["ops"] for r in rs),
                    "all": statistics.mean((r["write"]["device_write_bytes"] + r["fold"]["device_write_bytes"]) / r["ops"] for r in rs),
                    "iops": statistics.mean(r["iops"] for r in rs),
                }
        if len(means) == 2:
            a, b = means["c3"], means["ec"]
            print("EC/c3: device writes per write %s, reads %s, write calls %s, read calls %s; with the fold %s; IOPS %s (%.0f vs %.0f)" % (
                ratio(b["wr"], a["wr"]), ratio(b["rd"], a["rd"]), ratio(b["syscw"], a["syscw"]), ratio(b["syscr"], a["syscr"]),
                ratio(b["all"], a["all"]), ratio(b["iops"], a["iops"]), b["iops"], a["iops"]))

    seq = of("seq")
    if seq:
        print("\n== 3b. The VDI written whole, sequentially (fixed size, the close's fold included), cold page cache at the start")
        print("%-6s %4s %8s %14s %14s %12s" % ("VDI", "bs", "MB/s", "dev wr/byte", "dev rd/byte", "syscw/MiB"))
        for r in seq:
            n, io = r["logical"], r["io"]
            print("%-6s %4s %8.0f %14.2f %14.2f %12.1f" % (
                r["setup"], r["bs"], r["fio"]["mb_s"], io["device_write_bytes"] / n, io["read_bytes"] / n, io["syscw"] / (n / 2**20)))
        for bs in sorted({r["bs"] for r in seq}):
            a = next((r for r in seq if r["bs"] == bs and r["setup"] == "c3"), None)
            b = next((r for r in seq if r["bs"] == bs and r["setup"] == "ec"), None)
            if a and b:
                print("%s: EC/c3 MB/s %s, device writes %s" % (bs, ratio(b["fio"]["mb_s"], a["fio"]["mb_s"]),
                                                          ratio(b["io"]["device_write_bytes"], a["io"]["device_write_bytes"])))

    deg = of("degraded")
    if deg:
        print("\n== 4. Degraded reads: 4 KiB random reads, QD1, with nodes killed (kill -9, after the epoch dropped them and recovery ended)")
        print("%-6s %6s %8s %8s %8s %8s %8s %10s %8s %8s" % ("killed", "VDI", "IOPS", "mean us", "p50 us", "p99 us", "mean /0", "CPU us/op", "net", "net /0"))
        base = {r["setup"]: r for r in deg if r["killed"] == 0}
        for r in deg:
            b = base.get(r["setup"])
            print("%-6d %6s %8.0f %8.0f %8.0f %8.0f %8s %10.1f %8.1f %8s" % (
                r["killed"], r["setup"], r["iops"], r["mean_us"], r["p50_us"], r["p99_us"],
                ratio(r["mean_us"], b["mean_us"]) if b else "-", r.get("cpu_us", float("nan")), net(r),
                ratio(net(r), net(b)) if b else "-"))
        for k in sorted({r["killed"] for r in deg}):
            a = next((r for r in deg if r["killed"] == k and r["setup"] == "c3"), None)
            b = next((r for r in deg if r["killed"] == k and r["setup"] == "ec"), None)
            if a and b:
                print("killed %d: EC/c3 mean latency %s, p99 %s, net CPU per read %s" % (
                    k, ratio(b["mean_us"], a["mean_us"]), ratio(b["p99_us"], a["p99_us"]), ratio(net(b), net(a))))
        print("(CPU: the live nodes' user+system time per read, over the job and its ramp; net: above the idle 6-node"
              " cluster's, which overstates what fewer nodes use idle)")

    reb = of("rebuild")
    if reb:
        print("\n== 5. Rebuild after kill -9 of one of 7 nodes (VDI written whole and closed; cold page cache)")
        print("%-6s %5s %10s %9s %9s %8s %11s %11s %9s %9s %13s %15s" % (
            "VDI", "node", "lost", "detect s", "total s", "MB/s", "read", "written", "rd/lost", "wr/lost", "copied/lost", "refolded/lost"))
        for r in reb:
            lost = r["lost"]
            print("%-6s %5s %8sMi %9.1f %9.1f %8.0f %9sMi %9sMi %9.2f %9.2f %13s %15s" % (
                r["setup"], r["victim"], mib(lost), r["detect_s"], r["total_s"], lost / r["total_s"] / 1e6,
                mib(r["io"]["read_bytes"]), mib(r["io"]["device_write_bytes"]),
                r["io"]["read_bytes"] / lost, r["io"]["device_write_bytes"] / lost,
                "%s/%s" % (r.get("copied", "-"), r.get("lost_copies", "-")),
                "%s/%s of %s" % (r.get("refolded", "-"), r.get("lost_chunks", "-"), r.get("objects", "-")) if r["setup"] == "ec" else "-"))
        print("(lost: what the killed node held of the VDI; MB/s: lost over total; copied/lost: copies recovery made / objects (data and map)"
              " that had a copy on the killed node; refolded/lost: data objects whose chunks moved to the other slot / that had a chunk there)")
        a = [r for r in reb if r["setup"] == "c3"]
        b = [r for r in reb if r["setup"] == "ec"]
        if a and b:
            def m(rs, f):
                return statistics.mean(f(r) for r in rs)
            print("EC/c3: time %s, rebuild time after detection %s, bytes read %s, written %s (per byte lost: read %s, written %s)" % (
                ratio(m(b, lambda r: r["total_s"]), m(a, lambda r: r["total_s"])),
                ratio(m(b, lambda r: r["total_s"] - r["detect_s"]), m(a, lambda r: r["total_s"] - r["detect_s"])),
                ratio(m(b, lambda r: r["io"]["read_bytes"]), m(a, lambda r: r["io"]["read_bytes"])),
                ratio(m(b, lambda r: r["io"]["device_write_bytes"]), m(a, lambda r: r["io"]["device_write_bytes"])),
                ratio(m(b, lambda r: r["io"]["read_bytes"] / r["lost"]), m(a, lambda r: r["io"]["read_bytes"] / r["lost"])),
                ratio(m(b, lambda r: r["io"]["device_write_bytes"] / r["lost"]), m(a, lambda r: r["io"]["device_write_bytes"] / r["lost"]))))


def ticks(pids):
    """The CPU time (utime + stime, clock ticks) of the live pids."""
    total = 0
    for pid in pids:
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total


def settle(cluster, vdi, quiet, pids, nodes, limit=120.0):
    """Waits until the VDI's object files have not changed for 2 s and the
    pids used at most quiet ticks a second meanwhile; at most limit
    seconds. Returns a line saying how long it took, and why when long."""
    import time
    start = time.time()
    last, same, rate = None, 0, 0.0
    while True:
        t0, w0 = ticks(pids), time.time()
        time.sleep(1)
        t1, w1 = ticks(pids), time.time()
        c = census(cluster, vdi, nodes)
        now = (c["alloc"], c["files"])
        rate = (t1 - t0) / (w1 - w0)
        if now == last and rate <= quiet:
            same += 1
        else:
            same = 0
        last = now
        if same >= 2:
            return "settled in %.0f s" % (time.time() - start)
        if time.time() - start > limit:
            return "warning: vdi %d still changing after %.0f s (files %s, %.0f ticks/s, quiet is %d)" % (
                vdi, limit, now, rate, quiet)


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd, args = argv[1], argv[2:]
    if cmd == "census":
        print(json.dumps(census(args[0], int(args[1]), args[2:])))
    elif cmd == "placed":
        print(placed(json.load(open(args[0])), int(args[1]), int(args[2]), int(args[3])))
    elif cmd == "held":
        c = json.load(open(args[0]))
        print(" ".join("%s=%d" % kv for kv in c["held"].items()))
    elif cmd == "settle":
        # settle CLUSTER VDI_ID QUIET PID... -- NODE...
        i = args.index("--")
        print(settle(args[0], int(args[1]), int(args[2]), args[3:i], args[i + 1:]))
    elif cmd == "perf":
        # perf OUT FIO_JSON CPU_FILE KEY=VALUE...: a perf record
        fields = fio(args[1])
        cpu = open(args[2]).read().split()
        fields.update(cpu_us=float(cpu[3]), cores=float(cpu[4]))
        record(args[0], args[3:] + ["%s=%s" % kv for kv in fields.items()])
    elif cmd == "on":
        c = json.load(open(args[0]))
        copies = sum(1 for o in c["objects"].values() if args[1] in o["copies"])
        chunks = sum(1 for o in c["objects"].values() if any(args[1] in nodes for nodes in o["chunks"].values()))
        print(copies, chunks)
    elif cmd == "folded":
        a, b = slots(json.load(open(args[0]))), slots(json.load(open(args[1])))
        print(sum(1 for index, slot in b.items() if a.get(index) != slot))
    elif cmd == "io-snap":
        print(json.dumps(io_snap(args)))
    elif cmd == "io-diff":
        print(json.dumps(io_diff(json.load(open(args[0])), json.load(open(args[1])))))
    elif cmd == "evict":
        print(evict(args[0]))
    elif cmd == "fio":
        print(json.dumps(fio(args[0])))
    elif cmd == "record":
        record(args[0], args[1:])
    elif cmd == "report":
        report(args[0])
    else:
        sys.exit("ec.py: unknown command %r\n%s" % (cmd, __doc__))


if __name__ == "__main__":
    main(sys.argv)
