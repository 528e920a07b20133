"""What every shipped script's text must hold, read without running it (tests/lessons/test_scripts.py launches
with plain torchrun those for which a plain launch shows more than the notebook's): FSDP2's mesh named, the
set-up and the exit-race cure of lesson 00, one statement and one import a line, no variable read but torchrun's
and the devices'."""
from __future__ import annotations

import ast
import re

from fourcard_helpers.rundir import RUN_DIR_ENV
from helpers import NOTEBOOK_DIR, SCRIPT_VARIABLES, shipped_launches


def fully_shard_calls_without_mesh(text: str) -> list[str]:
    """The `fully_shard(...)` calls in `text` that do not pass `mesh=`."""
    tree = ast.parse(text)
    return [ast.unparse(node) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "fully_shard"
            and not any(keyword.arg == "mesh" for keyword in node.keywords)]


def test_fully_shard_calls_name_their_mesh() -> None:
    """Without `mesh=`, FSDP2 builds its mesh on the accelerator torch was built for (CUDA in any CUDA
    build) and moves the weights there, even when the launch runs simulated cards on gloo (seen on a
    one-GPU machine: 'target is on cpu, different from other tensors on cuda:0'). CI installs the CPU
    build, whose default mesh is on the CPU, so the rule is checked in the source of every shipped script."""
    assert fully_shard_calls_without_mesh("fully_shard(model)\nfully_shard(layer, mesh=mesh)") == ["fully_shard(model)"]
    offenders = {path.name: calls for path in sorted((NOTEBOOK_DIR / "scripts").glob("*.py"))
                 if (calls := fully_shard_calls_without_mesh(path.read_text()))}
    assert offenders == {}, f"fully_shard without mesh= in {offenders}"


def ends_without_teardown(text: str) -> bool:
    """Whether a script's last statement is `exit_without_teardown()`, imported from the package, at the top
    level or as the end of a closing `if __name__ == "__main__":` (a script with a `main()`)."""
    tree = ast.parse(text)
    body = tree.body
    if body and isinstance(body[-1], ast.If) and ast.unparse(body[-1].test) == "__name__ == '__main__'":
        body = body[-1].body
    imported = any(isinstance(node, ast.ImportFrom) and node.module == "fourcard_helpers"
                   and "exit_without_teardown" in [alias.name for alias in node.names] for node in ast.walk(tree))
    return imported and bool(body) and ast.unparse(body[-1]) == "exit_without_teardown()"


def test_every_script_that_joins_a_group_leaves_it_then_skips_pythons_teardown() -> None:
    """Lesson 00, "How a rank ends": a gloo thread can still be handing back the last collective when
    the script ends; if Python is shutting down by then, the rank aborts (SIGABRT) although its work
    is done, and destroy_process_group() cannot stop that thread while DDP still holds the group. So
    every shipped script that joins a group leaves it and ends with the package's exit_without_teardown()."""
    named = "from fourcard_helpers import exit_without_teardown\n"
    assert ends_without_teardown(named + "exit_without_teardown()\n")
    assert not ends_without_teardown("exit_without_teardown()\n")  # a definition of its own, not the lesson's
    assert not ends_without_teardown(named + "exit_without_teardown()\nprint('after')\n")
    assert not ends_without_teardown("import os, sys\nsys.stdout.flush(); os._exit(0)\n")  # the cure, unnamed
    assert ends_without_teardown(named + "if __name__ == '__main__':\n    main()\n    exit_without_teardown()\n")
    assert not ends_without_teardown(named + "if __name__ == '__main__':\n    main()\n")
    offenders = []
    for path in sorted((NOTEBOOK_DIR / "scripts").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "init_process_group(" not in text:
            continue
        if "destroy_process_group()" not in text or not ends_without_teardown(text):
            offenders.append(path.name)
    assert offenders == [], f"scripts that do not end with destroy_process_group() and then exit_without_teardown(): {offenders}"


# Lesson 00's set-up, line for line from the choice of cards to the device (a comment after a line, or a line of
# comment between, is the script's own; the group may be given a timeout; the cards counted may be the node's own,
# LOCAL_WORLD_SIZE, as lesson 12's scripts count them for a job that may span machines, the same number on one),
# in a script that imports torch; and the scripts that join a group another way on purpose.
SET_UP = (r'cards = detect\(int\(os\.environ\["(LOCAL_)?WORLD_SIZE"\]\)\)',
          r'dist\.init_process_group\(cards\.backend(, timeout=[\w.]+\(\w+=\d+\))?\)',
          r'rank, world = dist\.get_rank\(\), dist\.get_world_size\(\)',
          r'device = cards\.device\(int\(os\.environ\["LOCAL_RANK"\]\)\)',
          r'if cards\.kind == "cuda":',
          r'    torch\.cuda\.set_device\(device\)')
ANOTHER_SET_UP = {
    "00_how_a_rank_ends.py": "gloo on every machine: the threads gloo starts are what the script shows",
    "12_ddp_any_layout.py": "it reports torchrun's variables for every layout of nodes, so it reads them into one dict first",
    "train_any.py": "the template also runs as plain `python`, as a group of one",
}


def set_up_as_lesson_00(text: str) -> bool:
    """Whether `text` joins its group with lesson 00's set-up, SET_UP."""
    code = [line.split("  #")[0].rstrip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    starts = [index for index, line in enumerate(code) if line.startswith("cards = detect(")]
    return "import torch" in code and len(starts) == 1 and len(code) >= starts[0] + len(SET_UP) and all(
        re.fullmatch(pattern, line) for pattern, line in zip(SET_UP, code[starts[0]:]))


def test_every_script_that_joins_a_group_sets_up_as_lesson_00_teaches() -> None:
    """One set-up, written one way in every script, so that a learner who diffs one script against the next
    sees only what changed; a script that joins its group another way says why in ANOTHER_SET_UP."""
    lesson_00 = (NOTEBOOK_DIR / "scripts" / "00_hello_all_reduce.py").read_text(encoding="utf-8")
    assert set_up_as_lesson_00(lesson_00)
    rank_and_device = ('rank, world = dist.get_rank(), dist.get_world_size()\n'
                       'device = cards.device(int(os.environ["LOCAL_RANK"]))\n')
    for variant in ('rank, device = dist.get_rank(), cards.device(int(os.environ["LOCAL_RANK"]))\n',
                    'rank = dist.get_rank()\ndevice = cards.device(int(os.environ["LOCAL_RANK"]))\n',
                    'rank, world = dist.get_rank(), dist.get_world_size()\n'):  # the device left out
        assert rank_and_device in lesson_00 and not set_up_as_lesson_00(lesson_00.replace(rank_and_device, variant))
    assert not set_up_as_lesson_00(lesson_00.replace("import torch\n", ""))  # the cuda branch would fail on a GPU
    assert set_up_as_lesson_00(lesson_00.replace("dist.init_process_group(cards.backend)",
                                                 "dist.init_process_group(cards.backend, timeout=timedelta(seconds=20))"))
    offenders = [path.name for path in sorted((NOTEBOOK_DIR / "scripts").glob("*.py"))
                 if "init_process_group(" in (text := path.read_text(encoding="utf-8"))
                 and path.name not in ANOTHER_SET_UP and not set_up_as_lesson_00(text)]
    assert offenders == [], f"scripts whose set-up is not lesson 00's (SET_UP): {offenders}"
    assert all((NOTEBOOK_DIR / "scripts" / name).is_file() for name in ANOTHER_SET_UP)


def crowded_lines(text: str) -> list[int]:
    """The lines where a statement shares its line with another: `a; b`, `if x: y`, `import os, sys`
    (one import statement naming two modules). A script reads like a tutorial one step a line."""
    starts: dict[int, int] = {}
    crowded = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.stmt):
            starts[node.lineno] = starts.get(node.lineno, 0) + 1
        if isinstance(node, ast.Import) and len(node.names) > 1:
            crowded.add(node.lineno)
    return sorted(crowded | {line for line, count in starts.items() if count > 1})


def test_every_script_writes_one_statement_and_one_import_a_line() -> None:
    assert crowded_lines("import os\nimport sys\nif os:\n    print(sys)\n") == []
    assert crowded_lines("import os, sys\n") == [1]
    assert crowded_lines("x = 1; y = 2\n") == [1]
    assert crowded_lines("for i in range(2): print(i)\n") == [1]
    assert crowded_lines("class A:\n    def f(self): return 1\n") == [2]
    offenders = {path.name: lines for path in sorted((NOTEBOOK_DIR / "scripts").glob("[0-9][0-9]*.py"))
                 if (lines := crowded_lines(path.read_text(encoding="utf-8")))}
    assert offenders == {}, f"lines with more than one statement or import: {offenders}"


def variables_read(text: str) -> set[str]:
    """The environment variables a script reads itself: `os.environ[NAME]`, `os.environ.get(NAME)` and
    `os.getenv(NAME)`, NAME a literal or a comprehension's variable over a literal list; `*` for any other reach
    into the environment (a copy of `os.environ`, a name computed, `os` under another name, `from os import environ`,
    `environb`), which could read anything."""
    tree = ast.parse(text)
    lists = {node.targets[0].id: node.value for node in tree.body  # names = ["RANK", ...] at the top level
             if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    looped: dict[int, set[str]] = {}  # a comprehension's `name` (each node that reads it) -> what it takes
    for node in ast.walk(tree):
        for loop in getattr(node, "generators", []):
            source = loop.iter.value if isinstance(loop.iter, ast.Subscript) else loop.iter
            try:
                values = set(ast.literal_eval(lists.get(getattr(source, "id", None), source)))
            except (ValueError, TypeError, SyntaxError):
                continue
            for used in ast.walk(node):
                if isinstance(loop.target, ast.Name) and isinstance(used, ast.Name) and used.id == loop.target.id:
                    looped[id(used)] = values
    found, read_by_name = set(), set()
    for node in ast.walk(tree):
        reader = None
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            reader, key = node.value, node.slice
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            reader, key = node.func, node.args[0] if node.args else None
        if reader is not None:
            read_by_name.update(id(part) for part in ast.walk(reader))
            found |= {key.value} if isinstance(key, ast.Constant) else looped.get(id(key), {"*"})
    other = [node for node in ast.walk(tree)
             if (isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv")
                 and id(node) not in read_by_name)
             or (isinstance(node, ast.ImportFrom) and node.module == "os"
                 and {alias.name for alias in node.names} & {"environ", "environb", "getenv", "*"})
             or (isinstance(node, ast.Import) and any(alias.name == "os" and alias.asname for alias in node.names))]
    return found | ({"*"} if other else set())


def test_scripts_read_no_variable_but_torchruns_and_the_devices() -> None:
    """What the notebook's launcher adds to a rank's environment (its run folder, the barrier after init, the
    backend of matplotlib, the path) reaches a script through torch, matplotlib, Python or the package, never
    through a variable the script reads itself; tests/lessons/test_scripts.py launches plain every script for
    which one of those differences could show (helpers.plain_launch_reasons)."""
    assert variables_read('import os\nr = int(os.environ["RANK"])\nn = os.environ.get("WORLD_SIZE", "1")\n') == {"RANK", "WORLD_SIZE"}
    assert variables_read(f'import os\nos.getenv("{RUN_DIR_ENV}")\n') == {RUN_DIR_ENV}
    assert variables_read('import os\nnames = ["RANK", "A"]\n{n: os.environ[n] for n in names[:1]}\n') == {"RANK", "A"}
    assert variables_read('import os\n[os.environ[n] for n in ["A"]]\n[os.environ[n] for n in ["B"]]\n') == {"A", "B"}
    for anything in ("import os\nenv = dict(os.environ)\n", "import os\nname = 'RANK'\nos.environ[name]\n",
                     "from os import environ\nenviron['X']\n", "from os import getenv\ngetenv('X')\n",
                     "import os as o\no.environ['X']\n", "import os\nos.environb[b'X']\n", "import os\nget = os.getenv\nget('X')\n"):
        assert variables_read(anything) == {"*"}, anything
    readers = {script: extra for script, *_ in shipped_launches()
               if (extra := variables_read((NOTEBOOK_DIR / script).read_text(encoding="utf-8")) - SCRIPT_VARIABLES)}
    assert readers == {}, f"scripts that read variables other than torchrun's and the devices': {readers}"
