"""The journal knows nothing of chat: not in its code, nor in its migrations.

`journal.tests.settings_standalone` proves it by running; this says where a
dependency would come from when it does not.
"""

import ast
from pathlib import Path

from django.db.migrations.loader import MigrationLoader

JOURNAL = Path(__file__).resolve().parent.parent


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_journal_module_imports_chat():
    sources = list(JOURNAL.rglob("*.py"))
    assert len(sources) > 20  # the tree was found
    offenders = {
        str(path.relative_to(JOURNAL)): sorted(
            name for name in _imported_modules(path) if name.split(".")[0] == "chat"
        )
        for path in sources
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_no_journal_migration_depends_on_chat():
    """Declared dependencies only: chat may order its own migrations before
    the journal's (`run_before`), which is chat depending on the journal."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    journal = {
        key: migration
        for key, migration in loader.disk_migrations.items()
        if key[0] == "journal"
    }
    assert ("journal", "0001_initial") in journal
    for key, migration in journal.items():
        assert not [d for d in migration.dependencies if d[0] == "chat"], key
        assert not [d for d in migration.run_before if d[0] == "chat"], key
