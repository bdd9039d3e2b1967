"""A failed bind of the sidecar's /metrics names the setting that fixes it, in each spelling
that exists: the message used to name `exporter.listen`, which no layer reads."""

from __future__ import annotations

import dataclasses
import errno
import re
import socket

import pytest

from sidecar.cli.run import run
from sidecar.config.listen import ListenAddress
from sidecar.config.load import load_config
from sidecar.config.settings import Config
from sidecar.exporter.server import _bind_failed

ADDRESS = ListenAddress("127.0.0.1", 19464)
ERRORS = [
    OSError(errno.EADDRINUSE, "Address already in use"),
    OSError(errno.EACCES, "Permission denied"),
    OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
    socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
    OSError(errno.ENETDOWN, "Network is down"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: errno.errorcode.get(e.errno, str(e)))
def test_bind_errors_name_settings_that_exist(error: OSError) -> None:
    message = _bind_failed(ADDRESS, error)
    assert "exporter.listen" not in message
    spellings = re.search(r"set (\S+) \(config file\), (\S+) or (\S+) to", message)
    assert spellings, message
    key, variable, flag = spellings.groups()
    assert key in {field.name for field in dataclasses.fields(Config)}
    assert load_config(None, {variable: "off"}, {}).exporter_listen == "off"
    assert flag in {opt for param in run.params for opt in param.opts}
