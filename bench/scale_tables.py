"""bench/scale.py's printed tables: costs, memory and the diagnoses against the injected truth, per W."""


def fmt(v, f="%.1f"):
    return "-" if v is None else f % v


def tables(results, load, K, S_DETECTED, S_SILENT):
    lines = []
    lines.append("cost per W (vote and reduction: bytes per rank per step; trace: bytes per step per rank)")
    lines.append("%3s %8s %8s %9s %15s %17s %13s %21s %7s %14s %13s" % (
        "W", "train s", "step ms", "detect ms", "vote B f/meas", "vote recv B", "reduction B", "trace B files/rows/f",
        "ckpt B", "bisect s (own)", "audit s (own)"))
    for r in results:
        c, f, tr = r["train"]["collectives"], r["formula"], r["trace"]
        steps = max(1, tr["steps"])
        ck = r["checkpoints"].get("step-%08d.h5" % K)
        lines.append("%3d %8.1f %8.1f %9.2f %7d/%-7s %17s %13s %7.0f/%5.0f/%5.0f %7s %7.1f (%.2f) %7.1f (%.2f)" % (
            r["world"], r["train"]["wall"], r["train"]["step_ms_median"], r["train"]["detector_ms_median"],
            f["vote_send_bytes"], fmt(c.get("vote_send_bytes"), "%d"), fmt(c.get("vote_recv_bytes"), "%d"),
            fmt((c.get("reduction_sent_bytes") or 0) + (c.get("reduction_gather_recv_bytes") or 0), "%.0f"),
            tr["file_bytes"] / steps / r["world"], tr["row_bytes"] / steps / r["world"],
            f["trace_row_bytes_per_step_rank"], fmt(ck, "%d"), r["bisect"]["wall"], r["bisect"].get("seconds") or 0,
            r["audit"]["wall"], r["audit"].get("seconds") or 0))
    lines.append("")
    lines.append("memory per rank, MiB (peak: GNU time; anon/file/pss: training rank before MPI_Finalize; "
                 "footprint: the machine's MemAvailable drop during training)")
    lines.append("%3s %10s %10s %8s %8s %8s %8s %10s %10s %11s %10s" % (
        "W", "train max", "train med", "anon", "file", "shmem", "pss", "sum pss", "footprint", "bisect max",
        "audit max"))
    lines.append("%3s %10.1f %10s %8.1f %8.1f %8s %8.1f %10s %10s %11s %10s   (culprit train --help: load only)" % (
        "-", load["peak_rss_mib"], "", load.get("RssAnon", 0), load.get("RssFile", 0), "", load.get("Pss", 0),
        "", "", "", ""))
    for r in results:
        m = r["train"]["memory"]
        lines.append("%3d %10.1f %10.1f %8.1f %8.1f %8s %8.1f %10.0f %10.0f %11.1f %10.1f" % (
            r["world"], m["peak_rss_max_mib"], m["peak_rss_median_mib"], m["rss_anon_median_mib"] or 0,
            m["rss_file_median_mib"] or 0, fmt(m["rss_shmem_median_mib"]), m["pss_median_mib"] or 0,
            m["pss_sum_mib"] or 0, m["job_mem_drop_mib"], r["bisect"]["memory"]["peak_rss_max_mib"] or 0,
            r["audit"]["memory"]["peak_rss_max_mib"] or 0))
    lines.append("")
    lines.append("diagnosis against the injected truth (detected: step %d rank W-1 fc2 forward NaN; silent: step %d rank "
                 "W/2-1 fc3 forward bitflip)" % (S_DETECTED, S_SILENT))
    lines.append("%3s %-28s %-44s %-8s %-30s %s" % ("W", "incident (step/rank)", "bisect (verdict@step/phase/layer/rank, "
                                                    "replayed)", "audit", "twin difference", "exact"))
    for r in results:
        b, s, inc, d = r["bisect"], r["score"], r["incident"] or {}, r.get("twin_difference") or {}
        lines.append("%3d %-28s %-44s %-8s %-30s %s" % (
            r["world"], "%s@%s r%s %s" % (inc.get("detector"), inc.get("step"), inc.get("rank"), "ok" if s["detect"] else "WRONG"),
            "%s@%s/%s/%s/r%s, %s %s" % (b.get("verdict"), b.get("step"), b.get("phase"), b.get("layer"), b.get("rank"),
                                        b.get("steps_replayed"), "ok" if s["bisect"] else "WRONG"),
            "ok" if s["audit"] else "WRONG",
            ("%s/k%s/r%s/%s %s" % (d.get("step"), d.get("shard"), d.get("rank"), d.get("layer"),
                                   "ok" if s.get("twin") else "WRONG")) if "twin" in s else "-",
            "yes" if s["exact"] else "NO"))
    fps = {r.get("twin_fingerprint") for r in results if r.get("twin_fingerprint")}
    if fps:
        lines.append("clean twins' final fingerprints: %s" % (
            "all equal (%s) at W = %s" % (fps.pop(), ", ".join(str(r["world"]) for r in results)) if len(fps) == 1
            else "DIFFER: %s" % sorted(fps)))
    return "\n".join(lines)


def vote_table(results, cluster=False):
    """--vote-only: the vote's bytes per rank per step, before (one all-gather of records a step) and
    after (the summary over 4 nodes of W/4 ranks, and over MPI_COMM_TYPE_SHARED's nodes: one here
    under mpirun, the 4 real nodes of the namespaced cluster with --cluster), by role."""
    lines = ["vote bytes per rank per step (shim: contributed / received; the summary every step, the all-gather of",
             "records in the second round only: calls in 10 steps; leaders = node rank 0)",
             "'shared': MPI_COMM_TYPE_SHARED's nodes: " + ("4 real nodes (srun over scripts/slurm-cluster.sh)"
                                                         if cluster else "one node (mpirun on this machine)")]
    lines.append("%3s %17s | %5s %17s %17s %7s | %17s %17s %7s | %s" % (
        "W", "before all ranks", "K x N", "4 nodes: leader", "4 nodes: others", "2nd rd", "shared: leader",
        "shared: others", "2nd rd", "same decisions & bits"))
    for r in results:
        b, n, s = (r[k]["collectives"] for k in ("before", "nodes4", "shared"))
        pair = lambda c, role: "%d / %d" % (c["vote_%s_summary_send_bytes" % role] or 0,
                                            c["vote_%s_summary_recv_bytes" % role] or 0) \
            if c.get("vote_%s_summary_send_bytes" % role) is not None else "-"
        w = r["world"]
        lines.append("%3d %17s | %5s %17s %17s %7s | %17s %17s %7s | %s" % (
            w, "%d / %d" % (b["vote_gather_send_bytes"], b["vote_gather_recv_bytes"]),
            "%dx%d" % (max(1, w // 4), n["vote_leaders"]), pair(n, "leader"), pair(n, "other"),
            n["vote_gather_calls"], pair(s, "leader"), pair(s, "other"), s["vote_gather_calls"],
            "yes" if all(r[k]["same_decisions_and_bits"] for k in ("nodes4", "shared")) else "NO"))
    m = results[0]["before"].get("math") if results else None
    if m:
        lines.append("math: %s; BLAS %s, threads %s; intra-op threads %s" % (
            m.get("math"), (m.get("blas") or {}).get("library"), (m.get("blas") or {}).get("threads"),
            m.get("intra_op_threads")))
    return "\n".join(lines)
