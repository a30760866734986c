"""Nsight Compute profiles of a batch directory (tunecore.measure.batch), matched to programs: the fixture is
real ncu output of 9 TVM-built programs of BERT-base's matmul tasks on an H100 (bench/results/gpu.md), two of
them launching two kernels (main_kernel, main_kernel_1)."""

import os

from tunecore_ncu_costmodel import ncu_csv
from tunecore_ncu_costmodel.profilers import match_launches

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "real_h100_batch.csv")


def launches():
    with open(FIXTURE) as f:
        return ncu_csv.parse(f.read())


def test_launches_of_libraries_without_source_are_grouped_by_their_first_kernels_name():
    found = launches()
    assert len(found) == 11
    ids = [f"p{i}" for i in range(9)]
    programs = {i: {"kernels": []} for i in ids}  # built where the GPU is: a cubin, no source to read names from
    profiles = match_launches([[i, None] for i in ids], programs, found)
    assert list(profiles) == ids
    assert [p["ncu.kernels"] for p in profiles.values()] == [1.0] * 7 + [2.0, 2.0]
    # a two-kernel program's counts are the sum of its kernels'; its launch configuration is its first kernel's
    inst = "ncu.smsp__inst_executed.sum"
    kernels = found[7].metrics["smsp__inst_executed.sum"], found[8].metrics["smsp__inst_executed.sum"]
    assert profiles["p7"][inst] == sum(kernels)
    assert profiles["p7"]["ncu.launch__grid_size"] == found[7].metrics["launch__grid_size"]
    assert all(inst in p and "ncu.gpu__time_duration.sum" in p for p in profiles.values())


def test_launches_that_do_not_fit_the_programs_are_not_guessed():
    ids = [f"p{i}" for i in range(10)]  # one program more than the launches hold
    assert match_launches([[i, None] for i in ids], {i: {"kernels": []} for i in ids}, launches()) == {}


def test_known_kernel_names_match_in_order_and_a_failed_call_is_a_failed_profile():
    found = launches()[:3]
    programs = {"a": {"kernels": ["main_kernel"]}, "b": {"kernels": ["main_kernel"]}, "c": {"kernels": ["main_kernel"]},
                "x": {"kernels": ["main_kernel"]}}
    profiles = match_launches([["a", None], ["x", "run: it crashed"], ["b", None], ["c", None]], programs, found)
    assert profiles["x"] == {"ncu.failed": 1.0}
    assert [profiles[i]["ncu.kernels"] for i in "abc"] == [1.0, 1.0, 1.0]
    wrong = {i: {"kernels": ["other_kernel"]} for i in "abc"}
    assert match_launches([[i, None] for i in "abc"], wrong, found) == {}


def test_a_resumed_profiling_keeps_every_chunks_ncu_output(tmp_path, monkeypatch):
    """Each chunk's ncu output is saved under its first program's id, so a later call does not overwrite an earlier
    one's; ncu is a stand-in that runs the batch's call-once pass and prints one real H100 launch per program."""
    import json
    import stat

    from tunecore_ncu_costmodel.profilers import profile_batch

    from tunecore.testing.cli import cli_json, run_cli

    batch = tmp_path / "batch"
    cli_json(run_cli("dataset", "export-batch", "--model", "op:matmul-64", "--target", "llvm", "--per-task", "2",
                     "--out", str(batch), "--json"))
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    from tunecore_ncu_costmodel.ncu_csv import COMMAND  # ncu's own arguments, before the profiled command

    fake.write_text(f'#!/bin/sh\nshift {len(COMMAND)}\n"$@" > /dev/null 2>&1\nsed -n 4,6p "{FIXTURE}"\n'
                    'echo "==WARNING== a stand-in warning" >&2\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    first, second = (profile_batch(str(batch), limit=1, chunk=1) for _ in range(2))
    assert first["profiled"] == second["profiled"] == 1
    profiles = json.load(open(batch / "profiles.json"))
    assert len(profiles) == 2
    assert sorted(f for f in os.listdir(batch) if f.startswith("ncu-")) == sorted(f"ncu-{i}.{kind}" for i in profiles
                                                                              for kind in ("csv", "log"))
    assert all("stand-in warning" in open(batch / f"ncu-{i}.log").read() for i in profiles)
