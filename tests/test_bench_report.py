"""The benchmark's pure parts: target evaluation (bench_targets), readers of absent or partial result
files, bench.py's summaries, and the page's Targets table (bench_report). Nothing here measures or
asserts on a time: the figures are made up."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import bench
import bench_evidence
import bench_report as br
import bench_targets as bt


def single_row(ratio: float, rounds: int = 5) -> dict[str, Any]:
    floor = {
        "us_per_step": 300.0,
        "cpu_us_per_step": 40.0,
        "user_us_per_step": 20.0,
        "sys_us_per_step": 20.0,
        "samples": [300.0] * rounds,
        "steps_per_s": 1e6 / 300,
    }
    mine = {
        "us_per_step": 300.0 * ratio,
        "cpu_us_per_step": 160.0,
        "user_us_per_step": 130.0,
        "sys_us_per_step": 30.0,
        "samples": [300.0 * ratio] * rounds,
        "steps_per_s": 1e6 / (300 * ratio),
        "one_off": {"startup_ms": 5.0, "cpu_startup_ms": 4.0},
    }
    return {
        "rounds": rounds,
        "floor": floor,
        "effectlog": mine,
        "effectlog_over_floor": ratio,
        "effectlog_over_floor_rounds": [ratio] * rounds,
        "effectlog_minus_floor_us": 300.0 * (ratio - 1),
        "cpu_minus_floor_us": 120.0,
        "wait_minus_floor_us": 300.0 * (ratio - 1) - 120.0,
        "fsync_us_rounds": [90.0, 110.0],
        "evidence": {
            "floor": {"wal_frames_per_commit": 1.8, "checkpoints": 0},
            "effectlog": {"wal_frames_per_commit": 4.6, "checkpoints": 0},
            "ram": {
                "floor": {"us_per_step": 31.0, "cpu_us_per_step": 30.0},
                "rows": {"us_per_step": 61.0, "cpu_us_per_step": 60.0},
                "effectlog": {"us_per_step": 151.0, "cpu_us_per_step": 150.0},
                "effectlog_minus_floor_cpu_us": 120.0,
                "rows_minus_floor_cpu_us": 30.0,
            },
        },
    }


def made_up_results(ratios: dict[str, float], rounds: int = 5) -> dict[str, Any]:
    """A bench.json as bench.py writes it, with made-up figures."""
    return {
        "machine": {
            "cores": 2,
            "python": "3.11",
            "sqlite": "3.40",
            "date": "today",
            "quick": False,
            "fsync_us_start": 100.0,
            "fsync_us_end": 100.0,
        },
        "wal_regime": "pre-grown",
        "single": {n: single_row(r, rounds) for n, r in ratios.items()},
        "peers": {
            "dbos": {
                "1000": {
                    "effectlog_speedup": 6.0,
                    "effectlog_speedup_rounds": [6.0, 5.5, 4.0],
                    "us_per_step": 3000.0,
                    "cpu_us_per_step": 900.0,
                    "library": "dbos x",
                    "sqlite": {},
                    "samples": [3000.0],
                }
            },
            "langgraph": {"1000": {"error": "did not finish within 1 s"}},
        },
        "concurrent": {
            "1": {
                "runs": 1,
                "steps_per_run": 100,
                "steps_per_s": 2000.0,
                "samples": [2000.0],
                "over_one_run": 1.0,
                "commits": 202,
                "cpu_us_per_step": 150.0,
            },
            "32": {
                "runs": 32,
                "steps_per_run": 100,
                "steps_per_s": 8000.0,
                "samples": [8000.0],
                "over_one_run": 4.0,
                "over_one_run_rounds": [4.0, 6.0, 3.0],
                "commits": 300,
                "cpu_us_per_step": 110.0,
            },
        },
        "resume": [],
        "footprint": {"error": "not run"},
    }


RESUME_SHAPE: dict[str, Any] = {
    "resume_cpu_ms": {"1000": 10.0, "10000": 12.0, "100000": 25.0},
    "sealed_rerun_cpu_ms": {"33000": 30.0},
    "replay_verify_us_per_event_cpu": 3.5,
    "checkpoint_per_step_us": {"with": 150.0, "without": 148.0},
}


@pytest.mark.parametrize(
    ("measured", "limit", "at_most", "expected"),
    [
        (1.2, 1.3, True, (True, "met")),
        (1.3, 1.3, True, (True, "met")),
        (1.56, 1.3, True, (False, "missed by 20%")),
        (6.0, 5.0, False, (True, "met")),
        (4.0, 5.0, False, (False, "missed by 20%")),
        (0.998, 1.0, False, (False, "missed by less than 1%")),  # not "missed by 0%"
        (None, 5.0, False, (None, "not measured")),
        ("did not finish", 5.0, False, (None, "not measured")),
        (True, 5.0, False, (None, "not measured")),
    ],
)
def test_evaluate_says_met_missed_or_not_measured(
    measured: Any, limit: float, at_most: bool, expected: tuple[bool | None, str]
) -> None:
    """A figure at or within its limit is met, beyond it missed by the relative gap; anything that is not
    a number (absent, an error text, a bool) is "not measured", never met."""
    row = bt.evaluate("t", measured, limit, at_most=at_most)
    assert expected == (row["met"], row["status"])


def test_evaluate_counts_the_rounds_behind_a_median() -> None:
    """A median that meets the target while some rounds do not says how many rounds met it, and shows
    the spread of the rounds beside the median."""
    row = bt.evaluate("t", 1.2, 1.3, at_most=True, unit="x", each=[1.1, 1.2, 1.5])
    assert (True, "met (2 of 3 rounds met it)", "1.20x (rounds 1.10 to 1.50)") == (
        row["met"],
        row["status"],
        row["measured"],
    )


def test_a_missed_row_keeps_its_why_and_a_met_row_drops_it() -> None:
    """The why is shown for a miss only."""
    assert ("because", "") == (
        bt.evaluate("t", 2.0, 1.3, at_most=True, why="because")["why"],
        bt.evaluate("t", 1.0, 1.3, at_most=True, why="because")["why"],
    )


def test_read_results_of_absent_broken_or_non_object_files_is_none(tmp_path: Path) -> None:
    """The report reads companion results only when they are there and a JSON object."""
    broken, listed, good = tmp_path / "broken.json", tmp_path / "list.json", tmp_path / "good.json"
    broken.write_text("{not json")
    listed.write_text("[1, 2]")
    good.write_text(json.dumps({"a": 1}))
    expected = [None, None, None, {"a": 1}]
    assert expected == [bt.read_results(p) for p in (tmp_path / "absent.json", broken, listed, good)]


@pytest.mark.parametrize(
    ("by_size", "expected"),
    [
        ({"1000": 10.0, "100000": 25.0, "10000": 12.0}, 2.5),
        ({"33000": 30.0}, None),
        ({}, None),
        (None, None),
        ({"1000": 10.0, "100000": "n/a"}, None),
    ],
)
def test_flatness_is_largest_over_smallest_history(by_size: Any, expected: float | None) -> None:
    """Growth with history compares the largest size with the smallest, by number not by string order;
    fewer than two measured sizes say nothing about growth."""
    assert expected == bt.flatness(by_size)[0]


def test_fleet_rows_without_fleet_json_are_all_not_measured() -> None:
    """Every fleet target of issue 18 has a row, and without fleet.json none is met or missed."""
    rows = bt.fleet_targets(None)
    assert 8 == len(rows)
    assert [None] * 8 == [row["met"] for row in rows]
    assert all("fleet.json absent" in row["measured"] for row in rows)


def test_fleet_rows_read_fleet_json_by_backend_and_process_count() -> None:
    """Claims at the largest process count, scaling against one process, runs at the best count, the
    worst statements per run; a figure fleet.json lacks is "not measured"."""
    fleet = {
        "results": {
            "postgres": {
                "1": {"claims_per_s": 1000.0, "runs_per_s": 100.0, "statements_per_run": 28.0},
                "8": {"claims_per_s": 1600.0, "runs_per_s": 130.0, "statements_per_run": 31.0},
            },
            "sqlite": {
                "1": {"claims_per_s": 700.0, "runs_per_s": 200.0},
                "8": {"claims_per_s": 600.0, "runs_per_s": 260.0},
            },
        }
    }
    rows = bt.fleet_targets(fleet)
    expected = [
        ("PostgreSQL fleet claims/s at 8 runner processes >= 1,500", True),
        ("PostgreSQL fleet claims/s at 8 processes not below 1 process", True),
        ("SQLite fleet claims/s at 8 processes not below 1 process", False),
        ("PostgreSQL fleet runs/s (2-step no-op runs) >= 120 at the best process count", True),
        ("SQLite fleet runs/s (2-step no-op runs) >= 250 at the best process count", True),
        ("PostgreSQL statements per fleet run <= 30 (worst process count)", False),
        ("PostgreSQL commits per fleet run <= 7 (worst process count)", None),
        ("idle runners wait on LISTEN/NOTIFY (PostgreSQL) or a blocking lock (SQLite), not a 10 ms poll", None),
    ]
    assert expected == [(row["target"], row["met"]) for row in rows]


def test_claims_scaling_is_the_median_of_the_rounds_ratios_not_the_ratio_of_medians() -> None:
    """With interleaved rounds, "not below 1 process" reads the median of the per-round ratios (each
    round measured 1 and 8 processes back to back) and shows the rounds' range and how many met it;
    here the medians alone (900 at 8 against 1,000 at 1, from different rounds) would say 0.90, missed."""
    ratios = [1.05, 0.95, 1.10, 1.02, 0.98]
    fleet = {
        "results": {
            "sqlite": {
                "1": {"claims_per_s": 1000.0, "claims_vs_1": 1.0, "claims_vs_1_rounds": [1.0] * 5},
                "8": {"claims_per_s": 900.0, "claims_vs_1": 1.02, "claims_vs_1_rounds": ratios},
            }
        }
    }
    row = bt.fleet_targets(fleet)[2]
    assert (
        "SQLite fleet claims/s at 8 processes not below 1 process",
        True,
        "met (3 of 5 rounds met it)",
        "1.02x of 1 process (rounds 0.95 to 1.10)",
    ) == (row["target"], row["met"], row["status"], row["measured"])


def test_claims_scaling_of_a_fleet_json_without_rounds_is_the_ratio_of_the_medians() -> None:
    """fleet.json written before interleaved rounds has no per-round ratios: the row falls back to the
    ratio of the two counts' figures, with no rounds shown."""
    fleet = {"results": {"postgres": {"1": {"claims_per_s": 1000.0}, "8": {"claims_per_s": 1200.0}}}}
    row = bt.fleet_targets(fleet)[1]
    assert (True, "1.20x of 1 process") == (row["met"], row["measured"])


def test_fleet_bench_summarizes_rounds_into_medians_and_per_round_ratios() -> None:
    """fleet_bench.summarize: each count's figures are medians over its rounds, and its ratio to 1
    process is the median of the ratios within each round, with every round's ratio kept."""
    import fleet_bench

    claims = {
        1: [{"claims_per_s": r, "claim_cpu_us": 100.0} for r in (1000.0, 500.0, 800.0)],
        8: [{"claims_per_s": r, "claim_cpu_us": c} for r, c in ((900.0, 120.0), (600.0, 140.0), (700.0, 130.0))],
    }
    runs = {n: [{"runs_per_s": 100.0 * n, "cpu_ms_per_run": 4.0}] * 3 for n in (1, 8)}
    out = fleet_bench.summarize(claims, runs)
    eight = out["8"]
    assert (700.0, 130.0, 0.9, [0.9, 1.2, 0.875], 8.0) == (
        eight["claims_per_s"],
        eight["claim_cpu_us"],
        eight["claims_vs_1"],
        eight["claims_vs_1_rounds"],
        eight["runs_vs_1"],
    )
    assert [1.0, 1.0, 1.0] == out["1"]["claims_vs_1_rounds"]


def test_idle_wait_row_is_met_only_when_no_backend_polls() -> None:
    """The idle-runner row reads how each backend waits; a poll on either misses it."""
    waits = {"postgres": "LISTEN/NOTIFY", "sqlite": "10 ms poll"}
    row = bt.fleet_targets({"results": {}, "idle_wait": waits})[-1]
    assert (False, "sqlite still polls") == (row["met"], row["why"])


def test_resume_rows_without_resume_json_are_not_measured_but_show_bench_figures() -> None:
    """Without resume.json every resume row is "not measured"; bench.py's own figure is shown as context."""
    results = made_up_results({"1000": 1.2})
    results["resume"] = [
        {
            "half_events": 100000,
            "confirmed_steps": 33333,
            "half_resume_to_next_effect_cpu_ms": 900.0,
            "finished_rerun_cpu_ms": 150.0,
            "finished_fold_cpu_us_per_event": 6.5,
            "half_fold_cpu_us_per_event": 6.4,
        }
    ]
    rows = bt.resume_targets(None, results)
    assert [None] * 5 == [row["met"] for row in rows]
    assert "bench.py's own figure: 900.0 ms CPU at 100,000 events" in rows[0]["measured"]


def test_resume_rows_read_the_resume_json_shape() -> None:
    """resume.json's shape: 100k resume within 30 ms, flatness 100k over 1k, the 33k sealed re-run,
    replay per event; a sealed re-run measured at one size only cannot show flatness."""
    rows = bt.resume_targets(RESUME_SHAPE, made_up_results({"1000": 1.2}))
    expected = [True, False, False, None, True]
    assert expected == [row["met"] for row in rows]
    assert "33k-step" in rows[2]["target"]


def test_single_rows_explain_a_miss_with_cpu_and_wal_evidence() -> None:
    """A missed single-run ratio says how much of the excess is CPU and how much waiting, with the WAL
    pages per commit, the fsync latency and the RAM-disk pair of the same run; a quick run's few rounds
    are flagged."""
    rows = bt.single_targets(made_up_results({"100": 1.2, "1000": 1.5, "10000": 1.25}, rounds=2))
    assert [True, False, True, True] == [row["met"] for row in rows]
    why = rows[1]["why"]
    parts = (
        "120 µs of the excess is CPU",
        "4.6 WAL pages",
        "90 to 110 µs",
        "costs 120 µs per step more",
        "cost 30 µs more than the floor's: SQLite's share; the other 90 µs is effectlog's Python",
    )
    assert all(part in why for part in parts)
    assert rows[0]["status"].endswith("only 2 rounds (a quick run)")


def test_single_rows_for_a_size_not_run_are_not_measured() -> None:
    """A quick run without N=10,000 leaves that row, and the regime row, "not measured"."""
    rows = bt.single_targets(made_up_results({"100": 1.2, "1000": 1.2}))
    assert [True, True, None, None] == [row["met"] for row in rows]


def test_group_and_peer_rows() -> None:
    """32 concurrent runs against 5x; a peer that did not run is "not measured" with its error."""
    rows = bt.peer_and_group_targets(made_up_results({"1000": 1.2}))
    assert [True, None, False] == [row["met"] for row in rows]
    assert "did not finish" in rows[1]["measured"]
    assert "cannot exceed about 9,091 steps/s" in rows[2]["why"]


def test_the_page_has_every_target_row_of_issue_18(tmp_path: Path) -> None:
    """docs/performance.md's Targets table lists every target of issue 18, each met, missed or not
    measured, even when fleet.json and resume.json are absent."""
    doc = tmp_path / "docs" / "performance.md"
    results = made_up_results({"100": 1.2, "1000": 1.5, "10000": 1.25})
    results["ratios"] = bt.ratios(results)
    images = {"single": "img/a.png", "concurrency": "img/b.png"}
    br.write_doc(results, doc, images, tmp_path / "bench.json", fleet=None, resume=RESUME_SHAPE)
    text = doc.read_text()
    table = text.split("## Targets (issue 18)", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| target")]
    assert 20 == len(rows)
    assert all(line.rstrip(" |").rsplit("| ", 1)[1].startswith(("met", "missed", "not measured")) for line in rows)
    assert "### Why targets are missed" in text


def test_wal_frames_between_two_headers() -> None:
    """WAL frames written between two reads of the WAL index: the difference, or the new count after a
    checkpoint restarted the WAL (a new salt)."""
    between = bench_evidence.frames_between
    assert (5, 3) == (between((10, b"a"), (15, b"a")), between((7990, b"a"), (3, b"b")))


def test_resume_json_in_list_shape_reads_as_the_agreed_shape() -> None:
    """resume_bench.py's list shape (rows by events or steps) is read as the agreed keyed shape: sizes
    become keys, the replay figure is the worst size's, checkpoint costs come from per_step; the agreed
    shape, an absent file and an unrelated object pass through unchanged."""
    listed = {
        "resume": [{"events": 1000, "cpu_ms": 9.0}, {"events": 100000, "cpu_ms": 20.0}],
        "sealed_rerun": [{"steps": 333, "cpu_ms": 1.0}, {"steps": 33333, "cpu_ms": 15.0}],
        "replay": [{"events": 1000, "verify_us_per_event": 3.0}, {"events": 100000, "verify_us_per_event": 3.9}],
        "per_step": {"with_checkpoints": {"cpu_us_per_step": 150.0}, "without_checkpoints": {"cpu_us_per_step": 149.0}},
    }
    expected = {
        "resume_cpu_ms": {"1000": 9.0, "100000": 20.0},
        "sealed_rerun_cpu_ms": {"333": 1.0, "33333": 15.0},
        "replay_verify_us_per_event_cpu": 3.9,
        "checkpoint_per_step_us": {"with": 150.0, "without": 149.0},
    }
    assert expected == bt.normalize_resume(listed)
    assert (RESUME_SHAPE, None, {"other": 1}) == (
        bt.normalize_resume(RESUME_SHAPE),
        bt.normalize_resume(None),
        bt.normalize_resume({"other": 1}),
    )
    rows = bt.resume_targets(bt.normalize_resume(listed), made_up_results({"1000": 1.2}))
    assert [True, False, True, False, True] == [row["met"] for row in rows]


def measured(wall: float, cpu: float, **one_off: float) -> dict[str, float]:
    return {
        "us_per_step": wall,
        "cpu_us_per_step": cpu,
        "user_us_per_step": cpu * 0.8,
        "sys_us_per_step": cpu * 0.2,
        "waits_per_commit": 2.0,
        **one_off,
    }


def test_summarize_single_pairs_rounds_and_keeps_ram_pairs_apart() -> None:
    """bench.py's summary of one N: medians of the rounds, every ratio and difference taken within a
    round, effectlog's one-off costs kept apart, and the RAM-disk pair as evidence, not as the figure."""
    rows = {
        "floor": [measured(300, 30), measured(400, 30), measured(200, 40)],
        "effectlog": [
            measured(360, 150, startup_ms=5.0),
            measured(600, 160, startup_ms=7.0),
            measured(240, 140, startup_ms=6.0),
        ],
        "ram_floor": [measured(30, 30), measured(40, 40), measured(35, 35)],
        "ram_effectlog": [measured(150, 150), measured(170, 160), measured(160, 150)],
        "ram_rows": [measured(60, 60), measured(70, 70), measured(65, 65)],
    }
    out = bench.summarize_single(rows, [100.0, 120.0, 90.0], {})
    expected = {
        "ratio": 1.2,
        "cpu_minus": 120.0,
        "wall_minus": 60.0,
        "startup": 6.0,
        "ram_minus": 120.0,
        "rows_minus": 30.0,
        "ram_effectlog": 160.0,
    }
    actual = {
        "ratio": out["effectlog_over_floor"],
        "cpu_minus": out["cpu_minus_floor_us"],
        "wall_minus": out["effectlog_minus_floor_us"],
        "startup": out["effectlog"]["one_off"]["startup_ms"],
        "ram_minus": out["evidence"]["ram"]["effectlog_minus_floor_cpu_us"],
        "rows_minus": out["evidence"]["ram"]["rows_minus_floor_cpu_us"],
        "ram_effectlog": out["evidence"]["ram"]["effectlog"]["us_per_step"],
    }
    assert expected == pytest.approx(actual)
    assert [1.2, 1.5, 1.2] == pytest.approx(out["effectlog_over_floor_rounds"])
    assert (True, False) == ({"floor", "effectlog"} <= set(out), "ram_floor" in out)


def test_rounds_are_split_by_how_fast_the_disk_synced() -> None:
    """Each round's ratio is grouped by its own fsync probe, over every N; with only one kind of round
    there is nothing to compare and nothing is said."""
    results = made_up_results({"100": 1.2, "1000": 1.5})
    results["single"]["100"]["fsync_us_rounds"] = [50.0, 4000.0]
    results["single"]["100"]["effectlog_over_floor_rounds"] = [2.5, 1.0]
    results["single"]["1000"]["fsync_us_rounds"] = [60.0, 3000.0]
    results["single"]["1000"]["effectlog_over_floor_rounds"] = [3.0, 1.1]
    said = bt.by_disk(results)
    assert "2 rounds whose fsync probe took at most 500 µs had ratios 2.50 to 3.00" in said
    assert "2 rounds on a busier disk 1.00 to 1.10" in said
    results["single"]["100"]["fsync_us_rounds"] = [50.0, 40.0]
    results["single"]["1000"]["fsync_us_rounds"] = [60.0, 30.0]
    assert "" == bt.by_disk(results)


def test_sync_calls_are_read_from_an_strace_summary() -> None:
    """The calls column of every fsync-family row of `strace -c`, with or without an errors column;
    the total row and other calls are not counted."""
    summary = """% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 90.00    0.009000          60       150           fdatasync
 10.00    0.001000          20        50         2 fsync
------ ----------- ----------- --------- --------- ----------------
100.00    0.010000          50       200         2 total
"""
    assert 200 == bench_evidence.sync_calls(summary)
    assert 0 == bench_evidence.sync_calls("")


def test_a_missed_peer_ratio_is_explained_by_syncs_and_cpu_per_step() -> None:
    """The peer's why gives both sides' syncs per step and CPU per step from the same run."""
    results = made_up_results({"1000": 1.2})
    results["syncs"] = {"effectlog": {"syncs_per_step": 2.0}, "dbos": {"syncs_per_step": 4.0}}
    why = bt.why_peer(results, "dbos")
    assert "dbos waits for 4.0 syncs per step and effectlog for 2.0" in why
    assert "the ratio tends to 2.0" in why
    assert "dbos 900 µs, effectlog 160 µs (5.6x)" in why


def test_companions_run_when_present_and_a_failed_one_leaves_no_stale_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.py runs resume_bench.py and fleet_bench.py in their own processes, passing --quick on; one
    that fails is reported with its exit status and its old results file is removed, so the page says
    "not measured" rather than showing an older run's figures as this run's; an absent one is named."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "fleet.json").write_text("{}")
    (tmp_path / "resume_bench.py").write_text(
        "import json, pathlib, sys\n"
        "here = pathlib.Path(__file__).parent\n"
        "(here / 'results' / 'resume.json').write_text(json.dumps({'argv': sys.argv[1:]}))\n"
    )
    (tmp_path / "fleet_bench.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(bench, "HERE", tmp_path)
    ran = bench.run_companions(quick=True)
    assert {"resume": "ran", "fleet": "fleet_bench.py exited with status 3"} == ran
    assert {"argv": ["--quick"]} == json.loads((tmp_path / "results" / "resume.json").read_text())
    assert not (tmp_path / "results" / "fleet.json").exists()
    (tmp_path / "resume_bench.py").unlink()
    assert "resume_bench.py absent" == bench.run_companions(quick=False)["resume"]


def test_a_missed_replay_row_shows_where_replay_time_goes() -> None:
    """The parts resume_bench.py measured at the worst size (read, fold...) are the replay row's why."""
    listed = {
        "replay": [
            {"events": 1000, "verify_us_per_event": 5.0, "read_us_per_event": 1.0},
            {"events": 10000, "verify_us_per_event": 6.0, "read_us_per_event": 1.5, "pure_fold_us_per_event": 3.0},
        ]
    }
    row = bt.resume_targets(bt.normalize_resume(listed), made_up_results({"1000": 1.2}))[-1]
    expected = (
        "at 10,000 events, per event: read 1.50 µs, pure fold 3.00 µs (resume_bench.py). The read and the fold"
        " alone come to 4.50 µs, before the hash, the decode and the checks of the segments and the seal (about"
        " 2 µs more): each is already one pass over the rows in Python. "
    )
    assert (False, expected) == (row["met"], row["why"][: len(expected)])
    assert (True, 1) == ("compiled fold" in row["why"], row["why"].count("docs/architecture.md, replay"))


def test_fleet_bench_counts_a_postgresql_claim_as_the_commit_it_is() -> None:
    """The commits-per-run figure counts a statement run alone as a commit when it writes. Since fleet
    schema v3 a PostgreSQL claim is a call of the store's claim function (a SELECT that leases what it
    returns): the counter missed it and reported 6.00 commits per run for 7. Proves: the claim
    statement is counted as a write, and a plain read is not."""
    import fleet_bench
    from effectlog.fleet.postgres_store import CLAIM_NEXT

    assert (True, False) == (
        fleet_bench.WRITES.search(CLAIM_NEXT) is not None,
        fleet_bench.WRITES.search("SELECT state FROM effectlog_fleet.attempts WHERE attempt_id = %s") is not None,
    )


def test_counted_instructions_are_shown_with_the_machines_speed_or_said_not_measured() -> None:
    """The page shows valgrind's counts per step and what one µs of user-space CPU bought on the
    run's machine (instructions over the RAM-disk run's user time); without counts it says why."""
    results = made_up_results({"1000": 1.5})
    results["single"]["1000"]["evidence"]["ram"]["effectlog"]["user_us_per_step"] = 40.0
    results["instructions"] = {"one_run": 420_000.0, "runs_32": 350_000.0}
    text = "\n".join(br.instructions_section(results))
    assert "| 1 | 420.0k |" in text
    assert "| 32 | 350.0k |" in text
    assert "about 10,500 of these instructions per µs" in text
    results["instructions"] = {"error": "valgrind is not installed"}
    assert "Not measured in this run: valgrind is not installed." in br.instructions_section(results)
    del results["instructions"]
    assert any("Not measured" in line for line in br.instructions_section(results))


def test_a_missed_group_row_quotes_the_counts_of_the_same_run() -> None:
    """The 32-run reason quotes the run's own counts and the CPU per step 5x would need (a fifth of
    one run's wall time per step: 1e6 / 2000 / 5 = 100 µs here), never figures written by hand."""
    results = made_up_results({"1000": 1.2})
    results["instructions"] = {"one_run": 420_000.0, "runs_32": 350_000.0}
    why = bt.peer_and_group_targets(results)[2]["why"]
    assert "350.0k user-space instructions per step at 32 runs and 420.0k for one run" in why
    assert "(here 100 µs against 110)" in why
    del results["instructions"]
    assert "Counted by valgrind" not in bt.peer_and_group_targets(results)[2]["why"]


def test_the_cpu_model_is_read_from_proc_cpuinfo_or_left_out() -> None:
    """bench.json names the CPU (model and clock) as /proc/cpuinfo gives it, tabs and all; a text with
    no model name gives an empty string, and one with no readable clock gives the name alone."""
    import bench

    info = "processor\t: 0\nmodel name\t: AMD  EPYC 7B13\ncpu MHz\t\t: 2449.998\n\nprocessor\t: 1\n"
    assert "AMD EPYC 7B13 at 2,450 MHz" == bench.cpu_model(info)
    assert "AMD EPYC 7B13" == bench.cpu_model("model name\t: AMD EPYC 7B13\ncpu MHz\t: n/a\n")
    assert "" == bench.cpu_model("processor\t: 0\n")
