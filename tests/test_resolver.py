"""The resolver's own rules, beyond the machine matrix: ranks and names of the verdicts, where an explicit
choice or a disabled set came from, the arguments it refuses, what it passes on (with and without a
process group), and its one log event."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import torch.distributed as dist
from structlog.testing import capture_logs

from fp8select import BackendRejectedError, Capabilities, NoBackendError, UnknownBackendError, resolve
from fp8select.decision import builtin_backends, choose
from fp8select.errors import InvalidDtypeError, InvalidInputError
from fp8select.measured.table import new_table

F8 = ("float8_e4m3fn",)
CPU = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=F8)
CPU_TRITON = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=F8, packages={"triton": "3.9.0"})


def _resolve(caps: Capabilities = CPU, **kw: Any) -> Any:
    return resolve(caps, plugins=False, **kw)


def _verdicts(selection: Any) -> list[tuple[int, str, bool]]:
    return [(c.rank, c.name, c.accepted) for c in selection.verdicts]


# -- choose(): the pure decision --------------------------------------------------------------------


def test_ranks_count_from_one_a_repeated_name_once_and_an_explicit_name_outside_the_order_last() -> None:
    backends = builtin_backends()
    sel = choose(CPU_TRITON, backends, ["triton", "reference", "triton"])
    assert _verdicts(sel) == [(1, "triton", False), (2, "reference", True)]
    assert [b.name for b in sel.chain] == ["reference"] and sel.source == "auto"
    explicit = choose(CPU_TRITON, backends, ["triton"], explicit="reference", explicit_source="argument")
    assert [(c.rank, c.name) for c in explicit.verdicts] == [(1, "triton"), (2, "reference")]
    assert all(c.origin == "builtin" for c in explicit.verdicts)


def test_plugins_that_failed_follow_the_candidates_ranked_on() -> None:
    sel = choose(CPU, builtin_backends(), ["triton", "reference"], origins={"reference": "plugin:mine"},
                 failures=[("broken", "import failed"), ("other", "timed out")])
    assert [(c.rank, c.name, c.accepted, c.reason, c.origin) for c in sel.verdicts[2:]] == [
        (3, "plugin:broken", False, "import failed", "plugin"), (4, "plugin:other", False, "timed out", "plugin")]
    assert [c.origin for c in sel.verdicts[:2]] == ["builtin", "plugin:mine"]


def test_the_chain_is_the_choice_then_the_other_accepted_in_order() -> None:
    sel = choose(CPU_TRITON.with_overrides({"env.TRITON_INTERPRET": "1"}), builtin_backends(), ["triton", "reference"],
                 explicit="reference")
    assert sel.backend.name == "reference" and [b.name for b in sel.chain] == ["reference", "triton"]
    assert sel.source == "argument"


@pytest.mark.parametrize("kw, message", [
    ({"order": ["reference", "cublas"]}, "order: unknown backend 'cublas'"),
    ({"explicit": "cublas"}, "backend: unknown backend 'cublas'"),
    ({"explicit": "cublas", "explicit_source": "environment"}, "FP8SELECT_BACKEND: unknown backend 'cublas'"),
    ({"disabled": ["cublas"]}, "disable: unknown backend 'cublas'"),
    ({"disabled": ["cublas"], "disabled_source": "environment"}, "FP8SELECT_DISABLE: unknown backend 'cublas'"),
])
def test_an_unknown_name_is_reported_under_the_parameter_it_came_from(kw: dict[str, Any], message: str) -> None:
    kw = {"order": ["reference"], **kw}
    with pytest.raises(UnknownBackendError, match=message):
        choose(CPU, builtin_backends(), **kw)


def test_disabled_backends_say_by_what() -> None:
    sel = _resolve(CPU_TRITON, disable=["triton", "deepgemm"])
    reason = next(c.reason for c in sel.verdicts if c.name == "triton")
    assert reason == "disabled by disable=triton,deepgemm" and sel.disabled == ("triton", "deepgemm")
    env = _resolve(CPU_TRITON.with_overrides({"env.FP8SELECT_DISABLE": "triton"}))
    assert next(c.reason for c in env.verdicts if c.name == "triton") == "disabled by FP8SELECT_DISABLE=triton"
    assert _resolve(CPU_TRITON.with_overrides({"env.FP8SELECT_DISABLE": "triton"}), disable="deepgemm").disabled == ("deepgemm",)


def test_nothing_accepted_names_the_machine() -> None:
    with pytest.raises(NoBackendError, match=r"no backend can run this machine \(cpu, torch 2\.13\.0\+cpu\)"):
        _resolve(disable="reference")


def test_an_explicit_choice_rejected_names_its_source() -> None:
    with pytest.raises(BackendRejectedError) as info:
        _resolve(backend="triton")
    assert info.value.source == "argument" and info.value.name == "triton"


# -- resolve(): names as typed, where the choice comes from ---------------------------------------------


def test_names_are_read_from_strings_lists_and_generators_once() -> None:
    assert _resolve(CPU_TRITON, order="triton, Reference").backend.name == "reference"
    assert [c.name for c in _resolve(CPU_TRITON, order=(n for n in ["triton", "reference"])).verdicts] == ["triton", "reference"]
    assert _resolve(disable=(n for n in ["deepgemm"])).disabled == ("deepgemm",)


def test_the_environment_choice_and_auto() -> None:
    env = CPU.with_overrides({"env.FP8SELECT_BACKEND": "reference"})
    assert _resolve(env).source == "environment"
    assert _resolve(CPU.with_overrides({"env.FP8SELECT_BACKEND": "auto"})).source == "auto"
    assert _resolve(env, backend=" auto ").source == "environment"  # "auto" as an argument is no choice
    with pytest.raises(BackendRejectedError) as info:
        _resolve(CPU.with_overrides({"env.FP8SELECT_BACKEND": "triton"}))
    assert info.value.source == "environment"


@pytest.mark.parametrize("kw, error, message", [
    ({"capabilities": {"device_kind": "cpu"}}, InvalidDtypeError, "capabilities: expected a Capabilities snapshot or None, found dict "
     r"\(use Capabilities\.from_dict / from_json for JSON data\)"),
    ({"verify": "yes"}, InvalidDtypeError, "verify: expected True, False or None, found 'yes'"),
    ({"plugins": "mine"}, InvalidDtypeError, "plugins: expected True, False or an iterable of plugin objects, found 'mine'"),
    ({"plugins": 3}, InvalidDtypeError, "plugins: expected True, False or an iterable"),
    ({"group": "everyone"}, InvalidInputError, "group: expected a torch.distributed process group, 'world' or None, found 'everyone'"),
    ({"tuning": "yes"}, InvalidDtypeError, "tuning: expected True, False or a tuning table mapping, found 'yes'"),
    ({"on_mismatch": "ignore"}, InvalidInputError, "on_mismatch: expected 'common' or 'raise', found 'ignore'"),
    ({"backend": 3}, InvalidDtypeError, "backend: expected a backend name or None, found 3"),
    ({"order": []}, InvalidInputError, r"order: expected at least one backend name, found \[\]"),
    ({"order": ["reference", 3]}, InvalidDtypeError, "order: expected backend names"),
    ({"disable": 3}, InvalidDtypeError, "disable: expected backend names"),
    ({"max_weight_copies": -1}, InvalidInputError, "max_weight_copies"),
])
def test_arguments_of_the_wrong_kind_are_typed_errors(kw: dict[str, Any], error: type[Exception], message: str) -> None:
    kw = dict(kw)  # the parameter's own dict stays as it is for another run
    caps = kw.pop("capabilities", CPU)
    with pytest.raises(error, match=message):
        resolve(caps, **{"plugins": False, **kw})


def test_good_arguments_of_every_kind_pass() -> None:
    for kw in ({"plugins": []}, {"plugins": None}, {"verify": False}, {"tuning": False}, {"on_mismatch": "raise"},
               {"tuning": new_table("cpu")}):
        assert resolve(CPU, **{"plugins": False, **kw}).backend.name == "reference"


# -- what a selection carries on ------------------------------------------------------------------------


def test_max_weight_copies_and_tuning_are_passed_on() -> None:
    assert _resolve().max_weight_copies == 1
    assert _resolve(max_weight_copies=0).max_weight_copies == 0 and _resolve(max_weight_copies=None).max_weight_copies is None
    given = _resolve(tuning={**new_table("cpu"), "groups": [
        {"backend": "reference", "versions": {"torch": "2.13.0+cpu"}, "shapes": {"256,384": {"1": {"us": 5.0}}}}]})
    assert given.tuning_sources == ("given",) and given.measurements.backends == ("reference",)
    assert _resolve(tuning=False).measurements is None and _resolve(tuning=False).tuning_sources == ()


@pytest.fixture
def world_of_one(tmp_path: Any) -> Any:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_with_a_group_the_bound_and_the_group_are_passed_on_too(world_of_one: Any) -> None:
    sel = _resolve(CPU, group=world_of_one, max_weight_copies=0)
    assert sel.backend.name == "reference" and sel.max_weight_copies == 0 and sel.group is world_of_one
    assert _resolve(CPU, group="world", max_weight_copies=None).max_weight_copies is None
    assert _resolve(CPU, group="world").max_weight_copies == 1


# -- the one log event ----------------------------------------------------------------------------------


def test_the_resolved_event_says_what_was_chosen_from_what() -> None:
    with capture_logs() as logs:
        sel = _resolve(CPU_TRITON, disable="deepgemm")
    (event,) = [e for e in logs if e["event"] == "fp8select.resolved"]
    assert event["log_level"] == "info" and event["backend"] == "reference" and event["source"] == "auto"
    assert event["chain"] == ["reference"] and event["fingerprint"] == CPU_TRITON.fingerprint()
    assert event["verified"] is False
    assert event["rejected"] == {c.name: c.reason for c in sel.verdicts if not c.accepted}
    assert event["rejected"]["deepgemm"] == "disabled by disable=deepgemm"


def test_a_failed_resolution_is_a_warning_naming_its_source() -> None:
    with capture_logs() as logs, pytest.raises(BackendRejectedError):
        _resolve(CPU.with_overrides({"env.FP8SELECT_BACKEND": "triton"}))
    (event,) = logs
    assert (event["log_level"], event["backend"], event["source"]) == ("warning", None, "environment")
    assert "triton" in event["rejected"] and "reference" not in event["rejected"]
    with capture_logs() as logs, pytest.raises(NoBackendError):
        _resolve(disable="reference")
    assert logs[0]["source"] == "auto" and "reference" in logs[0]["rejected"]


def test_verify_true_checks_the_chain_before_returning() -> None:
    with capture_logs() as logs:
        sel = _resolve(CPU, verify=True)
    assert sel.backend.name == "reference"
    assert next(e for e in logs if e["event"] == "fp8select.resolved")["verified"] is True


# -- plugins given as objects ---------------------------------------------------------------------------


def _plugin(name: str, hook: Any) -> Any:
    from fp8select import hookimpl

    return type(name, (), {"fp8select_backends": hookimpl(lambda self: hook())})()


def _mine() -> list[Any]:
    from fp8select import Backend
    from fp8select.probes import DeviceKind

    class Mine(Backend):
        name = "mine"
        requires = (DeviceKind(("cpu",)),)

    return [Mine]


def test_a_plugins_backend_is_a_candidate_with_its_origin() -> None:
    sel = resolve(CPU, plugins=[_plugin("Ours", _mine)])
    mine = next(c for c in sel.verdicts if c.name == "mine")
    assert mine.accepted and mine.origin == "plugin:Ours"
    assert "mine" in [b.name for b in sel.chain]
    assert all(c.origin == "builtin" for c in sel.verdicts if c.name != "mine")


def test_a_plugin_that_fails_or_takes_a_builtin_name_is_a_rejected_verdict() -> None:
    from fp8select import Backend
    from fp8select.plugins import PluginWarning

    class Impostor(Backend):
        name = "reference"

    def broken() -> list[Any]:
        raise RuntimeError("no such library")

    with pytest.warns(PluginWarning):
        sel = resolve(CPU, plugins=[_plugin("Broken", broken), _plugin("Impostor", lambda: [Impostor])])
    failed = {c.name: c.reason for c in sel.verdicts if c.name.startswith("plugin:")}
    assert "no such library" in failed["plugin:Broken"] and "already taken" in failed["plugin:Impostor"]
    assert sel.backend.name == "reference" and next(c for c in sel.verdicts if c.name == "reference").origin == "builtin"


def test_a_plugins_time_limit_comes_from_the_snapshots_environment() -> None:
    import time

    from fp8select.plugins import PluginWarning

    def slow() -> list[Any]:
        time.sleep(0.6)
        return _mine()

    caps = CPU.with_overrides({"env.FP8SELECT_PLUGIN_TIMEOUT_S": "0.2"})
    with pytest.warns(PluginWarning, match="0.2 s"):
        sel = resolve(caps, plugins=[_plugin("Slow", slow)])
    assert "plugin:Slow" in [c.name for c in sel.verdicts] and "mine" not in [c.name for c in sel.verdicts]


# -- tuning tables and verification with a group ----------------------------------------------------------


H200 = Capabilities(device_kind="cuda", device_name="NVIDIA H200", compute_capability=(9, 0), torch_version="2.11.0+cu130",
                    cuda_version="13.0", packages={"triton": "3.6.0"}, has_scaled_mm=True,
                    scaling_types=("BlockWise1x128", "BlockWise128x128"), float8_dtypes=("float8_e4m3fn",),
                    triton_backends=("nvidia",))


def test_load_time_measurement_is_decided_once_and_explained(tmp_path: Any) -> None:
    """The default (measure where it pays) needs the device's own tables: a given table or none keeps the
    plans as they are; ``explain`` says which."""
    caps = H200.with_overrides({"env.FP8SELECT_CACHE_DIR": str(tmp_path)})
    default = resolve(caps, plugins=False, verify=False)
    assert default.tune_at_load and default.to_dict()["tune_at_load"] is True
    assert "load-time measurement: on" in default.explain() and "worker processes" not in default.explain()
    workers = resolve(caps.with_overrides({"env.FP8SELECT_JIT_PROCESSES": "16"}), plugins=False, verify=False)
    assert "compiled first in up to 16 worker processes (FP8SELECT_JIT_PROCESSES)" in workers.explain()
    assert not resolve(caps, plugins=False, verify=False, tuning=False).tune_at_load
    assert not resolve(caps, backend="triton", plugins=False, verify=False).tune_at_load  # it runs wherever it can
    assert not resolve(caps, plugins=False, verify=False, tuning=dict(default.tables[0])).tune_at_load
    off = resolve(caps.with_overrides({"env.FP8SELECT_TUNE": "off"}), plugins=False, verify=False)
    assert not off.tune_at_load and "load-time measurement: off" in off.explain()
    assert resolve(caps.with_overrides({"env.FP8SELECT_TUNE": "load"}), plugins=False, verify=False,
                   tuning=False).tune_at_load
    assert "load-time measurement" not in resolve(CPU, plugins=False, verify=False).explain()


def test_tuning_false_reads_no_table_even_where_one_ships() -> None:
    shipped = resolve(H200, plugins=False, verify=False)
    assert shipped.measurements is not None and shipped.tuning_sources and len(shipped.tables) == len(shipped.tuning_sources)
    none = resolve(H200, plugins=False, verify=False, tuning=False)
    assert none.measurements is None and none.tuning_sources == () and none.tables == ()
    table = {**new_table("NVIDIA H200"), "groups": [
        {"backend": "triton", "versions": {"triton": "3.6.0"}, "shapes": {"256,384": {"1": {"us": 5.0}}}}]}
    given = resolve(H200, plugins=False, verify=False, tuning=table)
    assert given.tables == (table,) and given.tuning_sources == ("given",)


def test_with_a_group_verification_runs_before_returning(world_of_one: Any) -> None:
    with capture_logs() as logs:
        _resolve(CPU, group=world_of_one, verify=True)
    assert next(e for e in logs if e["event"] == "fp8select.resolved")["verified"] is True


def test_a_disabled_candidate_keeps_its_rank_and_origin() -> None:
    sel = resolve(CPU, plugins=[_plugin("Ours", _mine)], disable="mine,triton", order="triton,mine,reference")
    assert [(c.rank, c.name, c.accepted, c.origin) for c in sel.verdicts] == [
        (1, "triton", False, "builtin"), (2, "mine", False, "plugin:Ours"), (3, "reference", True, "builtin")]


def test_a_device_level_check_that_raises_is_a_rejection_saying_so() -> None:
    from fp8select import Backend

    class Raising(Backend):
        name = "raising"

        def check(self, caps: Capabilities) -> Any:
            raise RuntimeError("probe exploded")

    sel = choose(CPU, {**builtin_backends(), "raising": Raising()}, ["raising", "reference"])
    assert sel.verdicts[0].reason == "its device-level check raised RuntimeError: probe exploded"
    assert not sel.verdicts[0].accepted and sel.backend.name == "reference"


def test_without_a_snapshot_this_machine_is_detected_and_a_cpu_is_not_verified() -> None:
    with capture_logs() as logs:
        sel = resolve(plugins=False)
    event = next(e for e in logs if e["event"] == "fp8select.resolved")
    assert sel.capabilities.device_kind == "cpu" and event["verified"] is False  # this CPU-only test machine


def test_the_plugin_time_limit_is_read_only_when_plugins_are_loaded() -> None:
    caps = CPU.with_overrides({"env.FP8SELECT_PLUGIN_TIMEOUT_S": "soon"})
    assert resolve(caps, plugins=False).backend.name == "reference"
    assert resolve(caps, plugins=None).backend.name == "reference"
    with pytest.raises(InvalidInputError, match="FP8SELECT_PLUGIN_TIMEOUT_S"):
        resolve(caps)
    assert resolve(CPU).backend.name == "reference"  # entry points read (none that takes a CPU here)


def _wrong() -> list[Any]:
    from fp8select.backends.reference import ReferenceBackend

    class Wrong(ReferenceBackend):
        name = "wrong"

        def run(self, *args: Any, **kwargs: Any) -> Any:
            return super().run(*args, **kwargs) * 2

    return [Wrong]


def test_verification_rejects_a_backend_that_computes_wrong_numbers() -> None:
    plugin = _plugin("Wrongs", _wrong)
    with capture_logs() as logs:
        sel = resolve(CPU, plugins=[plugin], order="wrong,reference", verify=True)
    assert sel.backend.name == "reference" and [b.name for b in sel.chain] == ["reference"]
    assert not next(c for c in sel.verdicts if c.name == "wrong").accepted
    assert any(e["event"] == "fp8select.verify_failed" and e["backend"] == "wrong" for e in logs)
    with pytest.raises(BackendRejectedError) as info:
        resolve(CPU, plugins=[plugin], backend="wrong", verify=True)
    assert info.value.source == "argument" and info.value.name == "wrong"


def test_with_a_group_every_argument_still_counts(world_of_one: Any) -> None:
    assert _resolve(CPU, group=world_of_one, backend="reference").source == "argument"
    assert [c.name for c in _resolve(CPU_TRITON, group=world_of_one, order="triton,reference").verdicts] == ["triton", "reference"]
    assert "mine" in [b.name for b in resolve(CPU, group=world_of_one, plugins=[_plugin("Ours", _mine)]).chain]
    with pytest.raises(UnknownBackendError):
        _resolve(CPU, group=world_of_one, backend="cublas")
    assert resolve(H200, plugins=False, group=world_of_one, tuning=False).measurements is None
    table = {**new_table("NVIDIA H200"), "groups": [
        {"backend": "triton", "versions": {"triton": "3.6.0"}, "shapes": {"256,384": {"1": {"us": 5.0}}}}]}
    given = resolve(H200, plugins=False, group=world_of_one, tuning=table)
    assert given.tuning_sources == ("given (rank 0)",) and given.tables == (table,)
