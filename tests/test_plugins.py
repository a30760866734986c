"""The plugin system: registration, names, errors, and a real third-party distribution."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pluggy
import pytest

from tunecore import hookimpl
from tunecore.builtin.random_search import RandomSearch
from tunecore.errors import PluginError
from tunecore.plugins import new_plugin_manager
from tunecore.registry import Registry, describe_plugins
from tunecore.testing.cli import assert_one_line_exit_2, run_cli


def _manager_with(*plugins):
    pm = new_plugin_manager(autoload=False)
    for i, plugin in enumerate(plugins):
        pm.register(plugin, name=f"test-plugin-{i}")
    return pm


class _Shadow(RandomSearch):
    name = "random"


class _DuplicatePlugin:
    @hookimpl
    def tunecore_register_search_policies(self, register):
        register(_Shadow)


class _NotASearchPolicy:
    name = "oops"


class _BadPlugin:
    @hookimpl
    def tunecore_register_search_policies(self, register):
        register(_NotASearchPolicy)


def test_builtins_are_registered_through_hooks():
    registry = Registry(_manager_with())
    assert registry.names("search") == ["random"]
    assert registry.names("cost_model") == ["none"]
    assert registry.names("store") == ["memory", "postgresql", "sqlite"]
    assert registry.names("builder") == ["dask", "local"] and registry.names("runner") == ["local", "rpc"]
    assert registry.names("measurer") == ["local"]
    assert {e.distribution for e in registry.entries()} == {"tunecore"}


def test_duplicate_name_names_both_distributions():
    with pytest.raises(PluginError) as error:
        Registry(_manager_with(_DuplicatePlugin()))
    message = str(error.value)
    assert "search policy 'random' is registered twice" in message
    assert "by tunecore (" in message and "by test-plugin-0 (" in message


def test_unknown_name_lists_installed_and_hints():
    registry = Registry(_manager_with())
    with pytest.raises(PluginError, match=r"unknown cost model 'nosuch'; installed: none .*tunecore plugins"):
        registry.get("cost_model", "nosuch")


def test_shared_registry_runs_registration_hooks_once_per_set_of_plugins():
    calls = []

    class Counting:
        @hookimpl
        def tunecore_register_search_policies(self, register):
            calls.append(1)

    pm = _manager_with(Counting())
    first = Registry.shared(pm)
    assert Registry.shared(pm) is first and len(calls) == 1
    pm.register(_DuplicatePlugin(), name="late")  # a plugin registered later is seen
    with pytest.raises(PluginError, match="registered twice"):
        Registry.shared(pm)
    assert len(calls) == 2


def test_registering_a_non_component_is_refused():
    with pytest.raises(PluginError, match="does not subclass SearchPolicy"):
        Registry(_manager_with(_BadPlugin()))


def test_hookspecs_are_documented_and_typed():
    from tunecore import hookspecs

    pm = pluggy.PluginManager("tunecore")
    pm.add_hookspecs(hookspecs)
    for name in dir(pm.hook):
        if name.startswith("tunecore_"):
            spec = getattr(hookspecs, name)
            assert spec.__doc__ and spec.__annotations__, name


def test_plugins_json_describes_the_core():
    plugins = describe_plugins(_manager_with())
    (core,) = plugins
    assert core["distribution"] == "tunecore"
    assert core["components"] == {"builder": ["dask", "local"], "cost_model": ["none"], "measurer": ["local"],
                                  "runner": ["local", "rpc"], "search": ["random"],
                                  "store": ["memory", "postgresql", "sqlite"]}
    assert "tunecore_register_search_policies" in core["hooks"]


def test_incompatible_target_is_refused_before_work(target):
    from tunecore.targets import resolve_target

    registry = Registry(_manager_with())
    cuda = resolve_target("cuda")
    import tvm

    if not tvm.cuda().exist:
        # the measurer's parts decide: the local runner needs the device here (a remote runner would not)
        registry.check_target(cuda, measurer="local")
        with pytest.raises(PluginError,
                           match="runner 'local' cannot be used with target cuda: there is no cuda device"):
            registry.check_target(cuda, runner="local")
        from tunecore.measure.local import LocalMeasurer

        with pytest.raises(PluginError, match="runner 'local' cannot be used with target cuda"):
            LocalMeasurer(cuda, registry=registry)
    registry.check_target(target, search="random", cost_model="none", measurer="local")


# A real third-party distribution, installed with pip into a separate directory.

_PLUGIN_MODULE = '''
from tunecore import hookimpl
from tunecore.builtin.random_search import RandomSearch


class FirstSketchSearch(RandomSearch):
    """Samples only the first sketch of the design space."""

    name = "first-sketch"

    def propose(self, task, n):
        context = self.contexts[task.task_id]
        out = []
        for _ in range(n * 20):
            sch = context.space.sample(sketch_index=0)
            if sch is None:
                continue
            from tunecore.interfaces import Candidate

            c = Candidate.from_schedule(task, sch, origin=self.name)
            if c.key not in context.measured and all(c.key != o.key for o in out):
                out.append(c)
            if len(out) == n:
                break
        return out


@hookimpl
def tunecore_register_search_policies(register):
    register(FirstSketchSearch)
'''

_DUPLICATE_MODULE = '''
from tunecore import hookimpl
from tunecore.builtin.random_search import RandomSearch


class AnotherRandom(RandomSearch):
    name = "random"


@hookimpl
def tunecore_register_search_policies(register):
    register(AnotherRandom)
'''

_MISSPELLED_MODULE = '''
from tunecore import hookimpl


@hookimpl
def tunecore_on_run_started(run, tasks):  # the hook is tunecore_on_run_start
    raise AssertionError("never called")
'''

def _guide_example(name):
    """The code block under ``<!-- example: NAME -->`` in docs/plugin-guide.md: the guide's examples are tested."""
    guide = (pathlib.Path(__file__).parents[1] / "docs" / "plugin-guide.md").read_text()
    block = guide.split(f"<!-- example: {name} -->", 1)[1]
    return block.split("```python\n", 1)[1].split("```", 1)[0]


_COMMAND_MODULE = _guide_example("command-plugin")

_PROFILER_MODULE = _guide_example("profiler-plugin")

_CLASHING_COMMAND_MODULE = '''
from tunecore import hookimpl


@hookimpl
def tunecore_register_commands(register):
    register("run", lambda args: 0, help="not tunecore's run")
'''


def _write_project(root, dist, package, module_text):
    project = root / dist
    (project / package).mkdir(parents=True)
    (project / package / "__init__.py").write_text(module_text)
    (project / "pyproject.toml").write_text(textwrap.dedent(f'''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "1.2.3"

        [project.entry-points.tunecore]
        {package} = "{package}"
        '''))
    return project


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("thirdparty")
    projects = [
        _write_project(root, "tunecore-first-sketch", "tunecore_first_sketch", _PLUGIN_MODULE),
        _write_project(root, "tunecore-dup", "tunecore_dup", _DUPLICATE_MODULE),
        _write_project(root, "tunecore-misspelled", "tunecore_misspelled", _MISSPELLED_MODULE),
        _write_project(root, "tunecore-hello", "tunecore_hello", _COMMAND_MODULE),
        _write_project(root, "tunecore-clash", "tunecore_clash", _CLASHING_COMMAND_MODULE),
        _write_project(root, "tunecore-artifact-size", "tunecore_artifact_size", _PROFILER_MODULE),
    ]
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    *map(str, projects)], check=True, capture_output=True)
    return site


def _env(site, only):
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "TUNECORE_LOAD_PLUGINS": only}


def test_third_party_search_policy_is_selectable_by_name(plugin_site, tmp_path):
    env = _env(plugin_site, "tunecore_first_sketch")
    listed = run_cli("plugins", env=env)
    assert listed.returncode == 0, listed.stderr
    (plugin,) = [p for p in json.loads(listed.stdout) if p["distribution"] == "tunecore-first-sketch"]
    assert plugin["version"] == "1.2.3" and plugin["components"] == {"search": ["first-sketch"]}

    store = str(tmp_path / "store.db")
    run = run_cli("run", "--model", "op:matmul-64", "--search", "first-sketch", "--trials", "4", "--store", store,
                  "--json", env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["trials_measured"] == 4
    from tunecore.store.sqlite import SqliteStore

    s = SqliteStore(store)
    (task,) = s.get_tasks()
    assert {r.origin for r in s.records(task.task_id)} == {"first-sketch"}
    s.close()


def test_duplicate_from_a_distribution_is_one_line_exit_2(plugin_site):
    result = run_cli("run", "--model", "op:matmul-64", "--trials", "1", "--store", "memory:",
                     env=_env(plugin_site, "tunecore_dup"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "registered twice: by tunecore (" in lines[0] and "by tunecore-dup (" in lines[0]


def test_autoload_can_be_disabled(plugin_site):
    env = dict(_env(plugin_site, ""), TUNECORE_DISABLE_PLUGIN_AUTOLOAD="1")
    listed = run_cli("plugins", env=env)
    assert [p["distribution"] for p in json.loads(listed.stdout)] == ["tunecore"]


def test_a_misspelled_hook_is_a_load_error_not_silence(plugin_site):
    listed = run_cli("plugins", env=_env(plugin_site, "tunecore_misspelled"))
    assert listed.returncode == 0
    (broken,) = [p for p in json.loads(listed.stdout) if p["name"] == "tunecore_misspelled"]
    assert "tunecore_on_run_started, which is not a tunecore hook" in broken["error"]
    assert "plugin 'tunecore_misspelled' failed to load and is skipped" in listed.stderr


def test_a_plugin_adds_a_command(plugin_site):
    env = _env(plugin_site, "tunecore_hello")
    result = run_cli("hello", "--name", "tuner", env=env)
    assert result.returncode == 0 and result.stdout == "hello, tuner\n", result.stderr
    assert "greet somebody" in run_cli("--help", env=env).stdout
    assert_one_line_exit_2(run_cli("hello", "--name", "nobody", env=env), "say hello to somebody")
    assert_one_line_exit_2(run_cli("hello", "--bogus", env=env), "unrecognized arguments: --bogus")
    (plugin,) = [p for p in json.loads(run_cli("plugins", env=env).stdout) if p["distribution"] == "tunecore-hello"]
    assert plugin["hooks"] == ["tunecore_register_commands"]
    assert run_cli("hello", env=_env(plugin_site, "tunecore_first_sketch")).returncode == 2  # not installed: no command


def test_a_command_name_taken_twice_names_both_distributions(plugin_site):
    result = run_cli("tasks", "--help", env=_env(plugin_site, "tunecore_clash"))
    assert_one_line_exit_2(result, "command 'run' is registered twice: by tunecore and by tunecore-clash")


def test_a_plugin_profiler_adds_metrics_to_every_record(plugin_site, tmp_path):
    from tunecore.store.sqlite import SqliteStore

    env, store = _env(plugin_site, "tunecore_artifact_size"), str(tmp_path / "s.db")
    run = run_cli("run", "--model", "op:matmul-64", "--trials", "3", "--store", store, "--json",
                  "-O", 'measurer.profilers=["artifact-size"]', env=env)
    assert run.returncode == 0, run.stderr
    opened = SqliteStore(store)
    (task,) = opened.get_tasks()
    records = opened.records(task.task_id)
    opened.close()
    assert len(records) == 3 and all(r.profile["artifact_bytes"] > 1000 for r in records)
    unknown = run_cli("run", "--model", "op:matmul-64", "--trials", "1", "--store", "memory:",
                      "-O", 'measurer.profilers=["ncu"]', env=env)
    assert_one_line_exit_2(unknown, "unknown profiler 'ncu'; installed: artifact-size")
