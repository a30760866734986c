"""What experiments share: timing things together so that drift falls on all of them alike."""

import json

import pytest

from tunecore.experiments import MADE_ON, cached_run, environment_line, passes_together, remeasure_together
from tunecore.testing import sample_candidates


def _recording_timers(names, calls):
    return {name: (lambda name=name: calls.append(name) or float(len(calls))) for name in names}


def test_passes_alternate_direction_or_follow_a_seeded_shuffle():
    calls = []
    samples = passes_together(_recording_timers("abc", calls), passes=2)
    assert calls == ["a", "b", "c", "c", "b", "a"]
    assert samples == {"a": [1.0, 6.0], "b": [2.0, 5.0], "c": [3.0, 4.0]}

    shuffled, again = [], []
    passes_together(_recording_timers("abcdef", shuffled), passes=4, seed=3)
    passes_together(_recording_timers("abcdef", again), passes=4, seed=3)
    assert shuffled == again  # reproducible
    passes = [shuffled[i:i + 6] for i in range(0, 24, 6)]
    assert all(sorted(p) == list("abcdef") for p in passes) and len({tuple(p) for p in passes}) > 1


def test_remeasure_together_gives_each_group_its_latencies_fastest_first(matmul_task):
    programs = sample_candidates(matmul_task, 3)
    latencies = remeasure_together(matmul_task, {"mine": programs[:2], "theirs": programs[2:]}, passes=2)
    assert len(latencies["mine"]) == 2 and len(latencies["theirs"]) == 1
    assert latencies["mine"] == sorted(latencies["mine"]) and all(0 < x < 1 for x in latencies["mine"])


def test_the_environment_line_names_cpu_cores_target_tvm_and_command():
    report = {"command": "python bench/x.py", "environment": {"cpu": "AMD EPYC", "cores": 2, "target": {"kind": "llvm"},
                                                              "versions": {"apache-tvm": "0.27.0.post1"}}}
    assert environment_line(report, threads=2) == ('CPU: AMD EPYC (2 cores, kernels on 2 threads), target `{"kind": '
                                                   '"llvm"}`, TVM 0.27.0.post1. Command: `python bench/x.py`.')


def test_a_run_cache_skips_what_it_holds_and_is_refused_on_another_machine(tmp_path, capsys):
    done, calls = str(tmp_path / "runs.json"), []
    assert cached_run(done, "a", lambda: calls.append("a") or {"x": 1}) == {"x": 1}
    assert cached_run(done, "a", lambda: calls.append("a") or {"x": 2}) == {"x": 1} and calls == ["a"]
    cache = json.load(open(done))
    del cache[MADE_ON]  # a file from before the machine was named: taken as this one's, and named from then on
    with open(done, "w") as f:
        json.dump(cache, f)
    assert cached_run(done, "a", lambda: calls.append("a") or {"x": 3}) == {"x": 1} and calls == ["a"]
    cache = json.load(open(done))
    assert set(cache) == {"a", MADE_ON} and cache[MADE_ON]["mcpu"] and cache[MADE_ON]["family_model"]
    cache[MADE_ON] = {**cache[MADE_ON], "family_model": "0/0"}
    with open(done, "w") as f:
        json.dump(cache, f)
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        cached_run(done, "b", lambda: calls.append("b") or {})
    assert refused.value.code == 2 and calls == ["a"]
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'family_model': '0/0'" in err and "another work folder" in err
