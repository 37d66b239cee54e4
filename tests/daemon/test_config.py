"""prosperod configuration: precedence flags > env > TOML > defaults, parsing and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from prospero.core.ratecard import DEFAULT_RATES
from prospero.core.wire.control import TcpEndpoint
from prospero.daemon.config import (
    ConfigError,
    load_config,
    load_rate_card,
    parse_addr,
    parse_token_file,
)
from prospero.testkit.certs import make_self_signed


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("PROSPERO_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config([], {})
    assert (cfg.bind_host, cfg.port) == ("127.0.0.1", 7878)
    assert cfg.data_dir == tmp_path / "xdg" / "prospero"
    assert cfg.db_path == cfg.data_dir / "events.db"
    assert cfg.host_label == "local"
    assert cfg.poll_interval == 2.0
    assert cfg.autostart is True and cfg.caliband_bin == "caliband"
    assert cfg.default_env == {} and cfg.retention_days == 0
    assert cfg.allow_acp is False and cfg.include_thinking is True
    assert cfg.caliband_network is None and cfg.api_tokens == {}
    assert (cfg.log_format, cfg.log_level) == ("text", "info")
    assert cfg.rate_card.rates == DEFAULT_RATES


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    toml = write(
        tmp_path / "prosperod.toml",
        """
addr = "127.0.0.1:1111"
host = "from-file"
poll_interval_ms = 100
retention_days = 3
log_format = "json"
autostart = false
default_env = { A = "file" }
include-thinking = false
caliband_bin = "/opt/caliband"
""",
    )
    env = {
        "PROSPERO_CONFIG": str(toml),
        "PROSPERO_HOST": "from-env",
        "PROSPERO_POLL_INTERVAL_MS": "200",
        "PROSPERO_DEFAULT_ENV": "A=env,B=x=y",
        "PROSPERO_AUTOSTART": "0",
    }
    # file only
    cfg = load_config(["--config", str(toml)], {})
    assert (cfg.bind_host, cfg.port, cfg.host_label) == ("127.0.0.1", 1111, "from-file")
    assert cfg.poll_interval == 0.1 and cfg.retention_days == 3 and cfg.log_format == "json"
    assert cfg.autostart is False and cfg.default_env == {"A": "file"}
    assert cfg.include_thinking is False and cfg.caliband_bin == "/opt/caliband"
    # env over file (config file found through PROSPERO_CONFIG)
    cfg = load_config([], env)
    assert cfg.host_label == "from-env" and cfg.poll_interval == 0.2
    assert cfg.default_env == {"A": "env", "B": "x=y"}
    assert cfg.port == 1111 and cfg.retention_days == 3  # untouched settings keep file values
    # flags over env over file
    cfg = load_config(
        [
            "--host",
            "from-flag",
            "--default-env",
            "A=flag",
            "--default-env",
            "C=3",
            "--autostart",
            "--include-thinking",
            "--addr",
            "127.0.0.1:2222",
        ],
        env,
    )
    assert cfg.host_label == "from-flag" and cfg.port == 2222
    assert cfg.default_env == {"A": "flag", "C": "3"}
    assert cfg.autostart is True and cfg.include_thinking is True
    assert cfg.poll_interval == 0.2  # env still beats the file


def test_boolean_forms(tmp_path: Path) -> None:
    assert load_config(["--no-autostart"], {}).autostart is False
    assert load_config([], {"PROSPERO_NO_AUTOSTART": "1"}).autostart is False
    assert load_config([], {"PROSPERO_ALLOW_ACP": "1"}).allow_acp is True
    assert load_config(["--allow-acp"], {}).allow_acp is True
    assert load_config(["--no-include-thinking"], {}).include_thinking is False
    toml = write(tmp_path / "c.toml", "no_autostart = true\n")
    assert load_config(["--config", str(toml)], {}).autostart is False
    with pytest.raises(ConfigError, match="allow_acp"):
        load_config([], {"PROSPERO_ALLOW_ACP": "maybe"})


def test_addr_forms() -> None:
    assert parse_addr("127.0.0.1:80") == ("127.0.0.1", 80)
    assert parse_addr("[::1]:7878") == ("::1", 7878)
    assert parse_addr("http://localhost:9000") == ("localhost", 9000)  # the CLI's URL form
    assert load_config(["--addr", "127.0.0.1:0"], {}).port == 0
    for bad in ("7878", "host:", ":80", "h:99999", "http://nohost"):
        with pytest.raises(ConfigError):
            parse_addr(bad)


def test_bad_values_are_config_errors(tmp_path: Path) -> None:
    cases: list[tuple[list[str], dict[str, str], str]] = [
        (["--poll-interval-ms", "fast"], {}, "poll_interval_ms"),
        (["--poll-interval-ms", "0"], {}, "poll_interval_ms"),
        (["--retention-days", "-1"], {}, "retention_days"),
        (["--log-format", "xml"], {}, "log_format"),
        (["--log-level", "loud"], {}, "log_level"),
        (["--default-env", "NOEQUALS"], {}, "default_env"),
        (["--default-env", "=v"], {}, "default_env"),
        ([], {"PROSPERO_ADDR": "nonsense"}, "addr"),
        (["--config", str(tmp_path / "missing.toml")], {}, "cannot read config file"),
        (["--database-url", "mysql://u@h/db"], {}, "database_url must be postgresql://"),
        ([], {"PROSPERO_DATABASE_URL": "/var/lib/db"}, "database_url must be postgresql://"),
    ]
    for argv, env, match in cases:
        with pytest.raises(ConfigError, match=match):
            load_config(argv, env)
    bad_toml = write(tmp_path / "bad.toml", "addr = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(["--config", str(bad_toml)], {})
    unknown = write(tmp_path / "unknown.toml", 'colour = "red"\n')
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        load_config(["--config", str(unknown)], {})


def test_api_tokens_file_and_env(tmp_path: Path) -> None:
    f = write(
        tmp_path / "tokens",
        "# operators\nalice: tok-a\n\nci:tok-c\nbare-token-without-name\ntok/with:colon\n",
    )
    tokens = parse_token_file(f)
    assert tokens == {
        "alice": "tok-a",
        "ci": "tok-c",
        "token-5": "bare-token-without-name",
        "token-6": "tok/with:colon",
    }
    cfg = load_config(["--api-token-file", str(f)], {"PROSPERO_API_TOKEN": "tok-env"})
    assert cfg.api_tokens == {**tokens, "env": "tok-env"}
    assert load_config([], {"PROSPERO_API_TOKEN": "  t  "}).api_tokens == {"env": "t"}
    with pytest.raises(ConfigError, match="duplicate"):
        parse_token_file(write(tmp_path / "dup", "a:1\na:2\n"))
    with pytest.raises(ConfigError, match="no token"):
        parse_token_file(write(tmp_path / "empty", "# nothing\n\n"))
    with pytest.raises(ConfigError, match="empty token"):
        parse_token_file(write(tmp_path / "blank", "name:   \n"))
    with pytest.raises(ConfigError, match="cannot read API token file"):
        load_config(["--api-token-file", str(tmp_path / "nope")], {})
    # the token is never accepted as a command-line flag (it would show in `ps`)
    with pytest.raises(SystemExit):
        load_config(["--api-token", "x"], {})


def test_refuse_non_loopback_without_token() -> None:
    for addr in ("0.0.0.0:7878", "192.168.1.10:7878", "[::]:7878", "example.com:80"):
        with pytest.raises(ConfigError, match="refusing to bind non-loopback"):
            load_config(["--addr", addr], {})
    assert (
        load_config(["--addr", "0.0.0.0:7878"], {"PROSPERO_API_TOKEN": "t"}).bind_host == "0.0.0.0"
    )
    for addr in ("127.0.0.1:1", "127.8.9.1:1", "[::1]:1", "localhost:1"):
        assert load_config(["--addr", addr], {}).api_tokens == {}


def test_scoped_tokens_file_and_insecure_no_auth(tmp_path: Path) -> None:
    from prospero.core.tokens import Scope, add_token

    f = tmp_path / "scoped"
    add_token(f, "ci", Scope.operate)
    cfg = load_config(["--api-tokens-file", str(f), "--addr", "0.0.0.0:7878"], {})
    assert cfg.api_tokens_file == f and cfg.api_tokens == {}
    assert load_config([], {"PROSPERO_API_TOKENS_FILE": str(f)}).api_tokens_file == f
    # an empty tokens file still turns auth on (tokens can be added while prosperod runs)
    empty = write(tmp_path / "empty-scoped", "# none yet\n")
    assert load_config(["--api-tokens-file", str(empty), "--addr", "0.0.0.0:1"], {})
    with pytest.raises(ConfigError, match=r"tokens file .*bad, line 2: unknown scope"):
        load_config(["--api-tokens-file", str(write(tmp_path / "bad", "\nx root sha256:0\n"))], {})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(["--api-tokens-file", str(tmp_path / "missing")], {})
    with pytest.raises(ConfigError, match="ci"):  # a name in both sources
        load_config(
            ["--api-tokens-file", str(f), "--api-token-file", str(write(tmp_path / "p", "ci:x\n"))],
            {},
        )
    with pytest.raises(ConfigError, match="--insecure-no-auth"):
        load_config(["--addr", "0.0.0.0:7878"], {})
    cfg = load_config(["--addr", "0.0.0.0:7878", "--insecure-no-auth"], {})
    assert cfg.insecure_no_auth and cfg.bind_host == "0.0.0.0"
    assert load_config(["--addr", "0.0.0.0:1"], {"PROSPERO_INSECURE_NO_AUTH": "1"}).insecure_no_auth


def test_caliband_network(tmp_path: Path) -> None:
    files = make_self_signed().write(tmp_path / "tls")
    token = write(tmp_path / "cal-token", "s3cret\n")
    cfg = load_config(
        [
            "--caliband-addr",
            "10.0.0.5:7000",
            "--caliband-ca-file",
            str(files.ca),
            "--caliband-token-file",
            str(token),
            "--caliband-server-name",
            "cal.internal",
        ],
        {},
    )
    net = cfg.caliband_network
    assert net is not None and net.endpoint == TcpEndpoint(addr="10.0.0.5:7000")
    assert net.security is not None
    assert net.security.token == "s3cret" and net.security.server_name == "cal.internal"
    # plaintext (only fakes accept it)
    net = load_config(["--caliband-addr", "127.0.0.1:7000"], {}).caliband_network
    assert net is not None and net.security is None
    # a token without a CA would travel in clear: refused
    with pytest.raises(ConfigError, match="without --caliband-ca-file"):
        load_config(["--caliband-addr", "h:1", "--caliband-token-file", str(token)], {})
    with pytest.raises(ConfigError, match="need --caliband-addr"):
        load_config(["--caliband-ca-file", str(files.ca)], {})
    garbage = write(tmp_path / "garbage.pem", "not a cert")
    with pytest.raises(ConfigError, match="caliband"):
        load_config(["--caliband-addr", "h:1", "--caliband-ca-file", str(garbage)], {})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(["--caliband-addr", "h:1", "--caliband-ca-file", str(tmp_path / "x")], {})
    env = {
        "PROSPERO_CALIBAND_ADDR": "h:2",
        "PROSPERO_CALIBAND_CA_FILE": str(files.ca),
    }
    net = load_config([], env).caliband_network
    assert net is not None and net.security is not None and net.security.token is None


def test_rate_card_files(tmp_path: Path) -> None:
    toml = write(
        tmp_path / "rates.toml",
        '[models."my-model"]\ninput = 2.5\noutput = 10\ncache_read = 0.25\n',
    )
    card = load_rate_card(toml)
    rate = card.rate_for("my-model")
    assert rate is not None and rate.input_per_mtok == 2.5 and rate.output_per_mtok == 10.0
    assert rate.cache_read_per_mtok == 0.25 and rate.cache_write_per_mtok is None
    assert card.rate_for("claude-sonnet-4-6") is not None  # built-ins stay
    js = write(tmp_path / "rates.json", '{"other": {"input_per_mtok": 1, "output_per_mtok": 2}}')
    assert load_rate_card(js).rate_for("other") is not None
    cfg = load_config(["--rate-card", str(toml)], {})
    assert cfg.rate_card.rate_for("my-model") == rate
    for text, match in [
        ("[models.m]\ninput = 1\n", "needs input and output"),
        ("[models.m]\ninput = 1\noutput = -2\n", "must be a number"),
        ("[models.m]\ninput = 1\noutput = 2\nbogus = 3\n", "unknown price"),
        ("models = 3\n", "must be a table"),
        ("[[[", "not valid"),
    ]:
        with pytest.raises(ConfigError, match=match):
            load_rate_card(write(tmp_path / "r.toml", text))


def test_slow_client_settings(tmp_path: Path) -> None:
    cfg = load_config([], {})
    assert (cfg.header_timeout, cfg.body_timeout, cfg.max_connections) == (10.0, 30.0, 2048)
    toml = write(tmp_path / "p.toml", "header_timeout_s = 4\nbody-timeout-s = 12.5\n")
    cfg = load_config(
        ["--config", str(toml), "--max-connections", "64"], {"PROSPERO_HEADER_TIMEOUT_S": "2.5"}
    )
    assert (cfg.header_timeout, cfg.body_timeout, cfg.max_connections) == (2.5, 12.5, 64)
    for argv in (
        ["--header-timeout-s", "0"],
        ["--header-timeout-s", "-1"],
        ["--body-timeout-s", "nan"],
        ["--body-timeout-s", "inf"],
        ["--body-timeout-s", "soon"],
        ["--max-connections", "0"],
        ["--max-connections", "1.5"],
    ):
        with pytest.raises(ConfigError):
            load_config(argv, {})


def test_automation_and_notification_settings(tmp_path: Path) -> None:
    cfg = load_config([], {})
    assert (cfg.automation_replay_window, cfg.notify_attempts, cfg.notify_backoff) == (
        300.0,
        5,
        0.5,
    )
    toml = write(tmp_path / "p.toml", "automation_replay_window_s = 60\nnotify-attempts = 3\n")
    cfg = load_config(
        ["--config", str(toml), "--notify-backoff-s", "2"], {"PROSPERO_NOTIFY_ATTEMPTS": "8"}
    )
    assert (cfg.automation_replay_window, cfg.notify_attempts, cfg.notify_backoff) == (
        60.0,
        8,
        2.0,
    )
    for argv, match in (
        (["--automation-replay-window-s", "0"], "automation_replay_window_s: must be > 0"),
        (["--notify-attempts", "0"], "notify_attempts: must be >= 1"),
        (["--notify-attempts", "21"], "notify_attempts: at most 20"),
        (["--notify-backoff-s", "soon"], "notify_backoff_s: expected a number"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config(argv, {})


def test_poll_backoff_settings(tmp_path: Path) -> None:
    cfg = load_config([], {})
    assert (cfg.poll_idle_backoff, cfg.poll_quiet_after) == (8.0, 10.0)
    toml = write(tmp_path / "p.toml", "poll_idle_backoff = 4\npoll-quiet-after-ms = 2500\n")
    cfg = load_config(["--config", str(toml)], {})
    assert (cfg.poll_idle_backoff, cfg.poll_quiet_after) == (4.0, 2.5)
    cfg = load_config(
        ["--config", str(toml), "--poll-quiet-after-ms", "0"],
        {"PROSPERO_POLL_IDLE_BACKOFF": "1.5", "PROSPERO_POLL_QUIET_AFTER_MS": "700"},
    )
    assert (cfg.poll_idle_backoff, cfg.poll_quiet_after) == (1.5, 0.0)
    for argv in (
        ["--poll-idle-backoff", "0.5"],
        ["--poll-idle-backoff", "nan"],
        ["--poll-idle-backoff", "inf"],
        ["--poll-idle-backoff", "lots"],
        ["--poll-quiet-after-ms", "-1"],
        ["--poll-quiet-after-ms", "1.5"],
    ):
        with pytest.raises(ConfigError):
            load_config(argv, {})


async def test_poll_backoff_reaches_the_fleet_manager(tmp_path: Path) -> None:
    from prospero.daemon.runtime import Runtime

    cfg = load_config(
        ["--data-dir", str(tmp_path / "d"), "--no-autostart", "--poll-idle-backoff", "3"],
        {"PROSPERO_POLL_QUIET_AFTER_MS": "1500"},
    )
    async with Runtime(cfg) as rt:
        assert rt.manager is not None
        assert (rt.manager.config.poll_idle_backoff, rt.manager.config.poll_quiet_after) == (
            3.0,
            1.5,
        )


def test_database_url_from_flag_or_env(tmp_path: Path) -> None:
    assert load_config([], {}).database_url is None  # standalone SQLite
    url = "postgresql://prospero@db.internal:5432/prospero"
    assert load_config(["--database-url", url], {}).database_url == url
    env = {"PROSPERO_DATABASE_URL": "postgres://u@h/x"}
    assert load_config([], env).database_url == "postgres://u@h/x"
    assert load_config(["--database-url", url], env).database_url == url  # flag wins


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "http://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: default}
current-context: x
"""


def test_fleet_backend_k8s_flags_env_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = write(tmp_path / "kubeconfig", KUBECONFIG)
    files = make_self_signed().write(tmp_path / "tls")
    token = write(tmp_path / "pod-token", "p0d\n")
    # default: the local backend, and the k8s settings stay at theirs
    cfg = load_config([], {})
    assert cfg.fleet_backend == "local" and cfg.k8s.namespace == "default"
    # flags: kubeconfig, namespace and the pod calibands' TLS + token (no --caliband-addr)
    cfg = load_config(
        [
            "--fleet-backend",
            "k8s",
            "--kubeconfig",
            str(kubeconfig),
            "--k8s-namespace",
            "agents",
            "--caliband-ca-file",
            str(files.ca),
            "--caliband-token-file",
            str(token),
            "--caliband-server-name",
            "pod.internal",
        ],
        {},
    )
    assert cfg.fleet_backend == "k8s" and cfg.caliband_network is None
    assert cfg.k8s.namespace == "agents" and cfg.k8s.kubeconfig == kubeconfig
    sec = cfg.k8s.caliband_security
    assert sec is not None and sec.token == "p0d" and sec.server_name == "pod.internal"
    assert sec.ca_pem == files.ca.read_bytes()
    # env (PROSPERO_K8S_NAMESPACE is the namespace's variable, caliband-wire.md §8.1)
    env = {
        "PROSPERO_FLEET_BACKEND": "k8s",
        "PROSPERO_KUBECONFIG": str(kubeconfig),
        "PROSPERO_K8S_NAMESPACE": "from-env",
    }
    cfg = load_config([], env)
    assert (cfg.fleet_backend, cfg.k8s.namespace) == ("k8s", "from-env")
    assert cfg.k8s.kubeconfig == kubeconfig and cfg.k8s.caliband_security is None
    # TOML (dashes or underscores), under env, under flags
    toml = write(
        tmp_path / "k8s.toml",
        f'fleet-backend = "k8s"\nkubeconfig = "{kubeconfig}"\nk8s_namespace = "from-file"\n',
    )
    cfg = load_config(["--config", str(toml)], {})
    assert (cfg.fleet_backend, cfg.k8s.namespace) == ("k8s", "from-file")
    cfg = load_config([], {"PROSPERO_CONFIG": str(toml), "PROSPERO_K8S_NAMESPACE": "env-ns"})
    assert cfg.k8s.namespace == "env-ns"
    cfg = load_config(["--k8s-namespace", "flag-ns"], {"PROSPERO_CONFIG": str(toml), **env})
    assert cfg.k8s.namespace == "flag-ns"
    # no --kubeconfig: lightkube's default resolution ($KUBECONFIG here; no service account)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    cfg = load_config(["--fleet-backend", "k8s"], {})
    assert cfg.k8s.kubeconfig is None and cfg.k8s.namespace == "default"


def test_fleet_backend_bad_combinations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = write(tmp_path / "kubeconfig", KUBECONFIG)
    files = make_self_signed().write(tmp_path / "tls")
    token = write(tmp_path / "pod-token", "p0d\n")
    k8s = ["--fleet-backend", "k8s", "--kubeconfig", str(kubeconfig)]
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cases: list[tuple[list[str], dict[str, str], str]] = [
        (["--fleet-backend", "nomad"], {}, "fleet_backend: expected one of local, k8s"),
        (["--kubeconfig", str(kubeconfig)], {}, "--kubeconfig needs --fleet-backend k8s"),
        ([], {"PROSPERO_K8S_NAMESPACE": "ns"}, "--k8s-namespace needs --fleet-backend k8s"),
        (
            ["--kubeconfig", str(kubeconfig), "--k8s-namespace", "ns"],
            {},
            "--kubeconfig/--k8s-namespace need --fleet-backend k8s",
        ),
        ([*k8s, "--caliband-addr", "h:1"], {}, "--caliband-addr is for --fleet-backend local"),
        ([*k8s, "--caliband-token-file", str(token)], {}, "would travel in clear"),
        ([*k8s, "--caliband-ca-file", str(tmp_path / "x")], {}, "cannot read caliband"),
        ([*k8s, "--k8s-namespace", "Not_A_Namespace"], {}, "k8s_namespace: expected"),
        ([*k8s, "--k8s-namespace", "n" * 64], {}, "k8s_namespace: expected"),
        (
            ["--fleet-backend", "k8s", "--kubeconfig", str(tmp_path / "none")],
            {},
            "k8s backend: kubeconfig",
        ),
        (
            ["--fleet-backend", "k8s", "--kubeconfig", str(write(tmp_path / "bad", "[: x"))],
            {},
            "k8s backend: kubeconfig",
        ),
        (
            ["--fleet-backend", "k8s", "--kubeconfig", str(write(tmp_path / "str", "hello"))],
            {},
            "k8s backend: kubeconfig",
        ),
        (["--fleet-backend", "k8s"], {}, "neither an in-cluster service account"),
        # the local backend still needs --caliband-addr for the caliband credentials
        (["--caliband-ca-file", str(files.ca)], {}, "or --fleet-backend k8s"),
    ]
    for argv, env, needle in cases:
        with pytest.raises(ConfigError) as err:
            load_config(argv, env)
        assert needle in str(err.value), (argv, env, str(err.value))


def test_prosperod_exits_2_on_a_fleet_backend_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prospero.daemon.main import EXIT_CONFIG, main

    kubeconfig = write(tmp_path / "kubeconfig", KUBECONFIG)
    assert main(["--kubeconfig", str(kubeconfig)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "prosperod: --kubeconfig needs --fleet-backend k8s" in err, err


def test_help_names_the_fleet_backend_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from prospero.daemon.config import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "--fleet-backend BACKEND" in text and "--k8s-namespace NAMESPACE" in text
    assert "absent: the in-cluster service account when run in a pod, else $KUBECONFIG" in text
