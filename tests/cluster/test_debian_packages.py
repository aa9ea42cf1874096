"""How the cluster installs what it takes from Debian (`kubeinfer.cluster.debian_packages`,
used by the node's packages and by the images' podman and mmdebstrap): the missing
programs' packages are asked for by package name, every apt-get call waits for the dpkg
lock instead of failing on it, a failed install updates the package lists once and tries
again, and what still fails is a BuildError with apt-get's own message.

apt-get here is a script on the PATH that records how it was called and acts as a machine
without package lists would (install fails until update has run): the real one would
change the host's packages, which no test may do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kubeinfer.cluster import debian_packages
from kubeinfer.cluster.gobuild import BuildError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="apt-get is only run as root")

APT_GET = """\
#!/bin/sh
echo "$*" >> "{calls}"
case "$1" in
  update) touch "{updated}"; exit 0 ;;
  install)
    if [ ! -e "{updated}" ] || [ -e "{broken}" ]; then
      echo "E: Unable to locate package $4" >&2; exit 100
    fi
    for program in {programs}; do
      printf '#!/bin/sh\\n' > "{bin}/$program"; chmod 755 "{bin}/$program"
    done ;;
esac
"""


@pytest.fixture
def apt_get(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recording apt-get first on the PATH; programs it "installs" land in `bin`, the
    only folder searched for them. Returns the file of its calls, one line each."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    script = tmp_path / "apt" / "apt-get"
    script.parent.mkdir()
    calls = tmp_path / "calls"
    script.write_text(APT_GET.format(calls=calls, updated=tmp_path / "updated",
                                     broken=tmp_path / "broken", programs="conntrack ip",
                                     bin=bin_))  # fmt: skip
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(debian_packages, "SEARCH_PATH", str(bin_))
    (bin_ / "runc").write_text("#!/bin/sh\n")
    (bin_ / "runc").chmod(0o755)
    return calls


NEEDED = {"runc": "runc", "conntrack": "conntrack", "ip": "iproute2"}


def test_missing_packages_are_installed_after_an_update_every_call_waiting_for_the_lock(
    apt_get: Path,
) -> None:
    said: list[str] = []
    found = debian_packages.ensure_programs(NEEDED, "the node", said.append)
    assert set(found) == set(NEEDED) and all(path.exists() for path in found.values())
    install = "install -y --no-install-recommends conntrack iproute2"
    lock = f"-o DPkg::Lock::Timeout={debian_packages.LOCK_WAIT_SECONDS}"
    assert apt_get.read_text().splitlines() == [
        f"{install} {lock}",
        f"update {lock}",
        f"{install} {lock}",
    ]
    assert said == ["installing conntrack, iproute2 from Debian for the node"]


def test_nothing_is_installed_when_every_program_is_there(apt_get: Path) -> None:
    assert debian_packages.ensure_programs({"runc": "runc"}, "the node", print) == {
        "runc": Path(debian_packages.SEARCH_PATH) / "runc"
    }
    assert not apt_get.exists()


def test_an_install_that_still_fails_says_what_apt_get_said(apt_get: Path) -> None:
    (apt_get.parent / "broken").touch()
    with pytest.raises(BuildError, match="Unable to locate package") as raised:
        debian_packages.ensure_programs(NEEDED, "the node", lambda _: None)
    assert "apt-get install -y --no-install-recommends conntrack iproute2" in str(raised.value)
    assert len(apt_get.read_text().splitlines()) == 3
