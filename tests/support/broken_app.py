"""An app module that fails at import (for the startup-failure tests): not an ImportError."""

raise RuntimeError("this app module is broken on purpose")
