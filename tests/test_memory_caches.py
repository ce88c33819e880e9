"""What fusionplan keeps in memory: named, bounded caches, listed and cleared from one place, and
no module-level dictionary that grows on its own."""

import ast
import threading
from pathlib import Path

import pytest
import torch

import fusionplan as fp
from fusionplan.core.caches import LruCache
from fusionplan.core.settings import cache_directory

SRC = Path(__file__).resolve().parents[1] / "src" / "fusionplan"

#: Module-level mutable maps that are not caches, each with why it stays.
NOT_CACHES = {
    ("api.py", "_default_handles"),  # the identity of a device's default handle (one per settings)
    ("runtime/launch.py", "_RECORD_LOCKS"),  # one lock per launch-record file
    ("core/ops.py", "_FIELD_NAMES"),  # per argument-record class: bounded by the classes
    ("core/caches.py", "_process_caches"),  # the list of the process's caches itself
}
_MUTABLE_CALLS = {"dict", "OrderedDict", "defaultdict", "list", "set", "WeakValueDictionary", "WeakKeyDictionary"}


def _empty_container(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict):
        return not value.keys
    if isinstance(value, (ast.List, ast.Set)):
        return not value.elts
    if isinstance(value, ast.Call):
        name = getattr(value.func, "id", getattr(value.func, "attr", None))
        return name in _MUTABLE_CALLS and not value.args and not value.keywords
    return False


def test_no_module_keeps_a_dictionary_of_its_own_as_a_cache():
    found = set()
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and _empty_container(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    found.add((path.relative_to(SRC).as_posix(), ast.unparse(target)))
    assert found == NOT_CACHES, "a module-level cache should be a core.caches.LruCache (or hang off the Handle)"


def test_the_least_recently_used_entry_goes_first():
    cache = LruCache("test order", 2, process=False)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.setdefault("a", 9) == 1 and cache.get_or_make("d", lambda: 4) == 4
    assert len(cache) == 2 and cache.values() == [1, 4]
    cache.clear()
    assert len(cache) == 0 and cache.get("a", "none") == "none"


def test_a_bad_size_or_a_second_cache_of_one_name_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        LruCache("test size", 0, process=False)
    first = LruCache("test unique name", 4)
    with pytest.raises(ValueError, match="exists already"):
        LruCache("test unique name", 4)
    del first


def test_the_bound_holds_under_threads():
    cache = LruCache("test threads", 50, process=False)

    def work(start: int) -> None:
        for i in range(start, start + 2000):
            cache.put(i % 173, i)
            cache.get((i * 7) % 173)

    threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 50 and len(cache.values()) == 50


def test_the_process_caches_are_listed_and_cleared_and_rebuilt_on_use():
    import fusionplan.runtime.launch  # noqa: F401  (its caches are made at import)
    import fusionplan.solvers.find  # noqa: F401
    import fusionplan.torch  # noqa: F401

    x, w, b = torch.randn(2, 3, 13, 11), torch.randn(17, 3, 3, 3), torch.randn(17)
    expected = torch.relu(torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1))
    torch.testing.assert_close(fp.conv_bias_activation(x, w, b, padding=1).double(), expected, rtol=1e-5, atol=1e-5)
    sizes = fp.cache_sizes()
    for name in (
        "one-call descriptors",
        "fused-chain plans",
        "fused-chain calls",
        "fused-chain arguments",
        "launch scratch",
        "split-reduction workspaces",
        "kernel modules",
        "stored find times",
    ):
        assert name in sizes
    assert sizes["one-call descriptors"] > 0
    fp.clear_caches()
    assert all(count == 0 for count in fp.cache_sizes().values())
    y = torch.full((2, 17, 13, 11), float("nan"))
    fp.conv_bias_activation(x, w, b, padding=1, out=y)  # made again
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_handles_caches_are_its_own():
    one, two = fp.Handle("cpu"), fp.Handle("cpu")
    one.cache("test", 4).put("k", 1)
    assert one.cache("test", 4).get("k") == 1 and two.cache("test", 4).get("k") is None
    fp.clear_caches()  # the process's caches only
    assert one.cache("test", 4).get("k") == 1
    one.clear_caches()
    assert one.cache("test", 4).get("k") is None


def test_the_cache_directory_comes_from_the_environment(tmp_path):
    assert cache_directory({"FUSIONPLAN_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_directory({"FUSIONPLAN_CACHE_DIR": " ", "XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "fusionplan"
    assert cache_directory({}) == Path.home() / ".cache" / "fusionplan"
    assert cache_directory({"FUSIONPLAN_CACHE_DIR": "~/fp"}) == Path.home() / "fp"
