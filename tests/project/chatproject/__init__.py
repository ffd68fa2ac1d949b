# Before Channels is imported: its six.moves imports on Python 3.12+.
from chatproject import django_six_on_python312  # noqa: F401
