"""The CA variables local agents get (services/controller/local/agent_ca.py): a system CA bundle becomes its hashed
directory (TLS contexts are then cheap), a user's own bundle is kept, `inherit` changes nothing."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient
from services.controller.config import load_config
from services.controller.local.agent_ca import INHERIT, SYSTEM_DIR, agent_ca_env
from tests.controller.conftest import Stack, run_controller, spec, wait_for


def hashed_dir(root: Path) -> Path:
    """A directory laid out like /etc/ssl/certs: a subject-hash link and the concatenated bundle."""
    root.mkdir(parents=True)
    (root / "ca-one.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    (root / "1a2b3c4d.0").symlink_to(root / "ca-one.pem")
    (root / "ca-certificates.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return root


def test_the_system_bundle_is_replaced_by_its_directory(tmp_path: Path) -> None:
    certs = hashed_dir(tmp_path / "certs")
    env = agent_ca_env({"SSL_CERT_FILE": str(certs / "ca-certificates.crt"), "PATH": "/bin"})
    assert env == {"SSL_CERT_DIR": str(certs), "PATH": "/bin"}
    # The same directory named twice is still one choice.
    env = agent_ca_env({"SSL_CERT_FILE": str(certs / "ca-certificates.crt"), "SSL_CERT_DIR": str(certs)})
    assert env == {"SSL_CERT_DIR": str(certs)}


def test_a_bundle_of_the_users_own_is_kept(tmp_path: Path) -> None:
    certs = hashed_dir(tmp_path / "certs")
    own = tmp_path / "corp-ca.pem"
    own.write_text("-----BEGIN CERTIFICATE-----\n")
    assert agent_ca_env({"SSL_CERT_FILE": str(own)}) == {"SSL_CERT_FILE": str(own)}
    # A system-named bundle in a folder without hash links is not known to equal a directory.
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "ca-certificates.crt").write_text("x")
    assert agent_ca_env({"SSL_CERT_FILE": str(plain / "ca-certificates.crt")}) == {
        "SSL_CERT_FILE": str(plain / "ca-certificates.crt")
    }
    # A bundle beside a different directory the user chose: both kept.
    other = hashed_dir(tmp_path / "other")
    mixed = {"SSL_CERT_FILE": str(certs / "ca-certificates.crt"), "SSL_CERT_DIR": str(other)}
    assert agent_ca_env(mixed) == mixed


def test_nothing_named_gets_the_system_directory_and_inherit_changes_nothing(tmp_path: Path) -> None:
    certs = hashed_dir(tmp_path / "certs")
    missing = str(tmp_path / "missing")
    assert agent_ca_env({}, SYSTEM_DIR, system_dirs=(missing, str(certs))) == {"SSL_CERT_DIR": str(certs)}
    assert agent_ca_env({}, SYSTEM_DIR, system_dirs=(missing,)) == {}
    assert agent_ca_env({"SSL_CERT_DIR": "/x"}, SYSTEM_DIR, system_dirs=(str(certs),)) == {"SSL_CERT_DIR": "/x"}
    bundle = {"SSL_CERT_FILE": str(certs / "ca-certificates.crt")}
    assert agent_ca_env(bundle, INHERIT) == bundle
    assert agent_ca_env({}, INHERIT, system_dirs=(str(certs),)) == {}
    with pytest.raises(ValueError, match="agent CA mode"):
        agent_ca_env({}, "bundle")


def test_the_controller_flag_and_its_variable(tmp_path: Path) -> None:
    certs = hashed_dir(tmp_path / "certs")
    env = {"SSL_CERT_FILE": str(certs / "ca-certificates.crt"), "AGL_KEY": "k"}
    assert load_config([], env).agent_base_env == {"SSL_CERT_DIR": str(certs)}
    assert load_config(["--agent-ca", "inherit"], env).agent_base_env == {"SSL_CERT_FILE": env["SSL_CERT_FILE"]}
    assert load_config([], {**env, "AGL_CONTROLLER_AGENT_CA": "inherit"}).agent_base_env == {
        "SSL_CERT_FILE": env["SSL_CERT_FILE"]
    }
    with pytest.raises(SystemExit):
        load_config(["--agent-ca", "bundle"], env)


@pytest.mark.parametrize("launch", ["warm", "fresh"])
async def test_agents_get_the_directory_and_still_verify(
    stack: Stack, ledger: LedgerClient, tmp_path: Path, launch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = Path("/etc/ssl/certs")
    if not (system / "ca-certificates.crt").exists():
        pytest.fail("this test needs Debian's ca-certificates (/etc/ssl/certs/ca-certificates.crt)")
    monkeypatch.setenv("SSL_CERT_FILE", str(system / "ca-certificates.crt"))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    out = tmp_path / "tls.json"
    rollout = spec(
        agent_class="tests.controller.agents.warm:TlsEnvAgent",
        env_map={"OUT_FILE": "input.out"},
        input_value={"out": str(out)},
        timeout_s=60,
        labels={"agl-launch": launch},
    )
    with run_controller(stack, tmp_path):
        [created] = await ledger.create_rollouts([rollout])
        done = (await wait_for(ledger, [created.rollout_id]))[created.rollout_id]
    assert done.status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED, done.status.error_message
    seen = json.loads(out.read_text())
    assert seen == {"SSL_CERT_FILE": None, "SSL_CERT_DIR": str(system), "verify_mode": int(ssl.CERT_REQUIRED)}
