"""Django 2.2's ``django.utils.six.moves`` on Python 3.12 and later.

Django 2.2 vendors six 1.10, whose importer of ``six.moves`` has only
``find_module``; Python 3.12 stopped calling that, so Channels 1.1.8's
``from django.utils.six.moves.urllib.parse import urlparse`` fails. This
gives the vendored importer the ``find_spec`` of later six releases (1.16).
It does nothing on Python 3.11 and earlier. A Channels 1.x project of your
own on Python 3.12+ needs the same, before Channels is imported
(docs/compatibility.rst).
"""

import importlib.util
import sys


def _find_spec(self, fullname, path, target=None):
    if fullname in self.known_modules:
        return importlib.util.spec_from_loader(fullname, self)
    return None


def _create_module(self, spec):
    return self.load_module(spec.name)


def _exec_module(self, module):
    pass  # load_module did it


def install():
    """Give django.utils.six's ``moves`` importer ``find_spec`` (Python 3.12+)."""
    if sys.version_info < (3, 12):
        return
    from django.utils import six

    for finder in sys.meta_path:
        if getattr(finder, "name", None) == six.__name__ and hasattr(finder, "known_modules"):
            if not hasattr(finder, "find_spec"):
                kind = type(finder)
                kind.find_spec = _find_spec
                kind.create_module = _create_module
                kind.exec_module = _exec_module


install()
