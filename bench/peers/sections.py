"""One table per workload, from the figures of every run, with the rows "tidal ÷ best peer" and the targets that
workload has, each met or missed: what the run prints, writes as Markdown and keeps in the JSON."""

from __future__ import annotations

import re
from typing import Any

from peers import COPIES, PEERS, RESUMABLE, TIDAL
from peers.plan import FRACTIONS, RAW_METHODS, S3_RUNS, TEXT_RUNS, raw_name, s3_name, text_name
from peers.tables import Table, Target, best, cell, check, med, ratio_rows, summary


def text_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    cols = [c for c in TEXT_RUNS if any(text_name(x, *c) in runs for x in loaders)]
    stats = {(x, c): summary(runs.get(text_name(x, *c)), "rate") for x in loaders for c in cols}
    rows = [[x, *(cell(stats[(x, c)], "rate") for c in cols)] for x in loaders]
    figures = [{x: med(stats[(x, c)]) for x in loaders} for c in cols]
    rows += ratio_rows(figures, False, loaders)
    table = Table(
        "text records/s, shuffled, steady state after the first batch",
        ["loader", *(f"{w} workers, batch {b}" if w else f"1 process, batch {b}" for w, b in cols)],
        rows,
        ["median (min-max) over the repetitions; records counted as the length of each batch's id column."],
    )
    fig = {c: figures[i] for i, c in enumerate(cols)}
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        one = fig.get((0, 8), {}).get(t)
        lit = fig.get((0, 8), {}).get("litdata")
        targets.append(check("text", f"{t} 1 process >= 1.5x LitData", one, lit and 1.5 * lit, False, "rate"))
        for w, b in ((2, 8), (2, 256)):
            mine = fig.get((w, b), {}).get(t)
            targets.append(check("text", f"{t} 2 workers batch {b} >= 1.3x its own 1 process", mine, one and 1.3 * one, False, "rate"))  # fmt: skip
            top = best(fig.get((w, b), {}), False)
            what = f"{t} 2 workers batch {b} >= 2x the best peer ({top[0] if top else '-'})"
            targets.append(check("text", what, mine, top and 2 * top[1], False, "rate"))
    return table, targets


def tokens_section(r: dict, loaders: list[str], threads: int) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    stats = {(x, w): summary(runs.get(f"tokens {x} w{w}"), "rate") for x in loaders for w in (0, 2)}
    rows = [[x, *(cell(stats[(x, w)], "rate") for w in (0, 2))] for x in loaders]
    figures = [{x: med(stats[(x, w)]) for x in loaders} for w in (0, 2)]
    rows += ratio_rows(figures, False, loaders)
    limit = med(summary(runs.get(raw_name("encode_batch", threads)), "rate"))
    for t in (x for x in TIDAL if x in loaders):
        rows.append(
            [f"{t} ÷ raw encode_batch, {threads} threads"]
            + [f"{f[t] / limit:.2f}x" if f.get(t) and limit else "-" for f in figures]
        )
    rows += [[label, value] for label, value in raw_rows(r, threads)]
    table = Table(
        "tokenize + pack into (8, 2048) rows, tokens/s, shuffled",
        ["loader", f"1 process ({threads} tokenizer threads)", f"2 workers (1 thread each, {threads} in all)"],
        rows,
        [
            "tidal: .tokenize(tokenizer).pack(2048).batch(8) through tidal.DataLoader; each peer: its record stream",
            "(its shuffle on) in one IterableDataset that runs encode_batch on 64 documents at a time, appends EOS,",
            "and cuts the stream into full 2048-token rows, 8 rows a batch, through a torch DataLoader (batch_size=None).",
            "tokens = rows x 2048. raw: 256 texts at a time already in memory, + one EOS per document. The targets",
            "divide by encode_batch, which the peers' wrapper calls; tidal calls encode_batch_fast (no offsets).",
            "RAYON_NUM_THREADS is set for every configuration, so every row uses the same threads.",
        ],
    )
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        for i, w in enumerate((0, 2)):
            what = f"{t} {'1 process' if not w else '2 workers'} >= 0.9x raw encode_batch, {threads} threads"
            targets.append(check("tokens", what, figures[i].get(t), limit and 0.9 * limit, False, "rate"))
    return table, targets


def first_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    base = summary(runs.get("first import"), "first_batch_from_start_s")
    stats = {x: summary(runs.get(f"first {x}"), "first_batch_from_start_s") for x in loaders}
    inner = {x: summary(runs.get(f"first {x}"), "first_batch_from_iter_s") for x in loaders}
    rows = [[x, cell(stats[x], "s"), cell(inner[x], "s")] for x in loaders]
    rows.append(['python -c "import torch, tidal"', cell(base, "s"), ""])
    rows += ratio_rows([{x: med(stats[x]) for x in loaders}], True, loaders)
    table = Table(
        "first batch, 2 workers, shuffled, batch 8 (seconds; lower is better)",
        ["loader", "from process start", "from iter()"],
        rows,
        ["from process start: from just before the parent starts the child process (imports included)."],
    )
    targets = []
    b = med(base)
    peer = best({x: med(stats[x]) for x in loaders}, True)
    for t in (x for x in TIDAL if x in loaders):
        mine = med(stats[t])
        targets.append(check("first", f"{t} <= import baseline + 0.3 s", mine, b and b + 0.3, True, "s"))
        what = f"{t} before every peer ({peer[0] if peer else '-'} first)"
        targets.append(check("first", what, mine, peer and peer[1], True, "s"))
    return table, targets


def resume_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs, saves = r["runs"], r["resume_save"]
    rows, at_load = [], {}
    for x in (x for x in loaders if x in RESUMABLE):
        save = saves.get(x, {"error": "not run"})
        for at in FRACTIONS:
            got = runs.get(f"resume {x} {at}")
            point = save.get("points", {}).get(str(at), {})
            load = summary(got, "first_batch_after_load_s")
            start = summary(got, "first_batch_from_start_s")
            exact = [g["exact"] for g in got or [] if "error" not in g]
            verdict = ("yes" if all(exact) else "NO") if exact else "-"
            at_load[(x, at)] = med(load) if exact and all(exact) else None
            consumed = f"{point['consumed_records']:,}" if point else save.get("error", "-")
            state = f"{point['state_bytes']:,}" if point else "-"
            rows.append([x, f"{at:.0%}", consumed, cell(load, "s"), cell(start, "s"), verdict, state])
    for at in FRACTIONS:
        for label, ratio in ratio_rows([{x: at_load.get((x, at)) for x in loaders}], True, loaders):
            rows.append([label, f"{at:.0%}", "", ratio])
    table = Table(
        "resume: state_dict() saved after 10% / 90% of an epoch (2 workers, shuffled, batch 8), loaded in a new process",
        ["loader", "at", "records consumed", "load_state_dict -> 1st batch, s", "from process start, s", "exact", "state bytes"],
        rows,
        [
            "exact: the first batch after load_state_dict has the ids of the batch the saving loader yielded next.",
            "÷ best peer: load_state_dict -> 1st batch (lower is better); an inexact resume counts as none.",
        ],
    )  # fmt: skip
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        for at in FRACTIONS:
            what = f"{t} at {at:.0%} no slower than LitData"
            targets.append(check("resume", what, at_load.get((t, at)), at_load.get(("litdata", at)), True, "s"))
        lo, hi = at_load.get((t, FRACTIONS[0])), at_load.get((t, FRACTIONS[-1]))
        targets.append(check("resume", f"{t} flat: 90% <= 1.25x 10%", hi, lo and 1.25 * lo, True, "s"))
    return table, targets


def rss_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    cols = [(0, 8), (2, 8)]
    rss = {(x, c): summary(runs.get(text_name(x, *c)), "peak_rss_gb") for x in loaders for c in cols}
    uss = {(x, c): summary(runs.get(text_name(x, *c)), "peak_uss_gb") for x in loaders for c in cols}
    rows = [[x, *(cell(d[(x, c)], "gb") for c in cols for d in (rss, uss))] for x in loaders]
    figures = [{x: med(d[(x, c)]) for x in loaders} for c in cols for d in (rss, uss)]
    rows += ratio_rows(figures, True, loaders)
    table = Table(
        "peak memory of the whole process tree (main + workers), GB, during the text runs (lower is better)",
        ["loader", "RSS, 1 process", "USS, 1 process", "RSS, 2 workers", "USS, 2 workers"],
        rows,
        [
            "Sampled from /proc/PID/smaps_rollup every 0.2 s by the parent, summed over the tree, peak over the run.",
            "RSS counts pages shared between processes (forked workers) once per process; USS only private pages.",
        ],
    )
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        for i, name in ((0, "1 process"), (2, "2 workers")):
            lean = best(figures[i], True)
            what = f"{t} peak RSS, {name} <= the leanest peer ({lean[0] if lean else '-'})"
            targets.append(check("rss", what, figures[i].get(t), lean and lean[1], True, "gb"))
    return table, targets


def s3_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    cols = [c for c in S3_RUNS if any(s3_name(x, *c) in runs for x in loaders)]
    stats = {(x, c): summary(runs.get(s3_name(x, *c)), "rate") for x in loaders for c in cols}

    def median_of(x: str, c: tuple[int, int], key: str, ok: bool = True) -> float | None:
        """The median of ``key`` over the runs (those that yielded figures, where ``ok``), counted for failed ones too."""
        got = [
            {k: v for k, v in g.items() if k != "error"}
            for g in runs.get(s3_name(x, *c)) or []
            if not ok or "error" not in g
        ]
        return med(summary(got, key))

    # a loader read the server where the server logged GETs during its runs that yielded figures
    silent = {x for x in loaders if any(median_of(x, c, "server_gets") == 0 for c in cols)}
    rows = []
    for x in loaders:
        cells = ["failed" if "error" in stats[(x, c)] else cell(stats[(x, c)], "rate") for c in cols]
        first = summary(runs.get(s3_name(x, *cols[0])) if cols else None, "first_batch_from_start_s")
        whole = summary(runs.get(s3_name(x, *cols[0])) if cols else None, "rate_from_start")
        gets = [median_of(x, c, "server_gets", ok=False) for c in cols]
        get_cells = " / ".join("-" if g is None else f"{g:,.0f}" for g in gets)
        mb = [median_of(x, c, "cache_mb", ok=False) for c in cols]
        mb_cells = " / ".join("-" if m is None else f"{m:,.1f}" for m in mb)
        errors = {c: stats[(x, c)]["error"].removeprefix("failed: ") for c in cols if "error" in stats[(x, c)]}
        if len(errors) == len(cols) and len({re.sub(r"[0-9.]+", "#", e) for e in errors.values()}) == 1:
            why = next(iter(errors.values()))  # the same failure every time (timings aside): once
        else:
            why = "; ".join(f"{w} workers: {e}" if w else f"1 process: {e}" for (w, _), e in errors.items())
        if x in silent:
            why = "no GET reached the server: left out of the ratios" + (f"; {why}" if why else "")
        start = [
            cell(first, "s") if "error" not in first else "-",
            cell(whole, "rate") if "error" not in whole else "-",
        ]
        rows.append([x, *cells, *start, get_cells, mb_cells, why])
    figures = [{x: None if x in silent else med(stats[(x, c)]) for x in loaders} for c in cols]
    rows += ratio_rows(figures, False, loaders)
    labels = [f"{w} workers, batch {b}" if w else f"1 process, batch {b}" for w, b in cols]
    up = r.get("s3", {})
    uploaded = ", ".join(
        f"{fmt} {u['objects']} objects, {u['bytes'] / 1e6:,.0f} MB" for fmt, u in up.get("uploaded", {}).items()
    )
    v = r.get("versions", {})
    table = Table(
        "from S3: every loader's copy on moto's S3 server (127.0.0.1), text records/s, shuffled, cold cache",
        [
            "loader",
            *labels,
            "1st batch from start, s (1 process)",
            "records/s from start (1 process)",
            "server GETs per run",
            "local cache, MB",
            "why it failed",
        ],
        rows,
        [
            f"moto {v.get('moto', '?')} server at {up.get('endpoint', '-')}, in its own process on this machine (its CPU "
            f"time is taken from the loaders'); the copies uploaded at the start ({up.get('upload_s', 0):.1f} s): "
            f"{uploaded or '-'}.",
            "Every run a fresh process with a fresh, empty local cache directory (removed after it), fake credentials in",
            "its environment only; records/s after the first batch, as in the text table. 1st batch from start: the cold",
            "set-up included (imports, listing, indexes, the first downloads); records/s from start: every record of the",
            "run over the time from process start, which counts what a loader downloads before its first batch (tidal",
            "fetches a line file whole to index it) as much as what it downloads after. server GETs per run: the GET",
            "requests the server logged during the run (medians, failed runs too; 1 process / 2 workers); local cache: what",
            "the loader had written to its cache directory by the end. A loader with no GET counted is left out of the",
            "ratios and targets.",
            *(f"{x}: {PEERS[x].how}" for x in loaders),
            "LitData's obstore client is allowed plain http (its default client options refuse it; real S3 is https).",
        ],
    )
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        for i, label in enumerate(labels):
            top = best(figures[i], False)
            what = (
                f"from S3 (moto on loopback): {t}, {label}, at least 1.2x the peers that read the same server "
                f"(best: {top[0] if top else '-'})"
            )
            targets.append(check("s3", what, figures[i].get(t), top and 1.2 * top[1], False, "rate"))
    return table, targets


def raw_rows(r: dict, threads: int) -> list[tuple[str, str]]:
    """The raw tokenizer's figures: each method on 1 thread and on ``threads``."""
    return [
        (f"raw {m}, {t} thread{'s' if t > 1 else ''}", cell(summary(r["runs"].get(raw_name(m, t)), "rate"), "rate"))
        for m in RAW_METHODS
        for t in sorted({1, threads})
    ]


def limits_section(r: dict, threads: int) -> Table:
    runs = r["runs"].get("cache", [])
    rows = []
    for fmt in COPIES:
        s = summary([g.get(fmt, g) for g in runs], "gb_per_s")
        sizes = [g[fmt]["bytes"] for g in runs if fmt in g]
        rows.append([f"page cache, {fmt} files", cell(s, "gb") + " GB/s", f"{sizes[0] / 1e6:,.0f} MB" if sizes else ""])
    rows += [[label, value + " tokens/s"] for label, value in raw_rows(r, threads)]
    return Table(
        "physical limits",
        ["what", "rate", "size"],
        rows,
        ["page cache: every data file of the format read whole twice in one process; the second pass is timed."],
    )


def sections(
    res: dict[str, Any], loaders: list[str], workloads: set[str], threads: int
) -> tuple[list[Table], list[Target]]:
    tables, targets = [], []
    builders = [
        ("text", lambda: text_section(res, loaders)),
        ("tokens", lambda: tokens_section(res, loaders, threads)),
        ("first", lambda: first_section(res, loaders)),
        ("resume", lambda: resume_section(res, loaders)),
        ("rss", lambda: rss_section(res, loaders)),
        ("s3", lambda: s3_section(res, loaders)),
    ]
    for name, build in builders:
        if name in workloads:
            table, got = build()
            table.targets = got
            tables.append(table)
            targets += got
    if "limits" in workloads:
        tables.append(limits_section(res, threads))
    return tables, targets
