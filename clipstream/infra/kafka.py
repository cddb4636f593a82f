"""A single-node KRaft Kafka broker from the official jars on Maven Central.

Why Maven and not the release tarball: the network here reaches package registries only, and
Maven Central carries the same jars. Why Kafka 3.9: it still speaks every old protocol version,
which older clients such as aiokafka need. The broker is tuned to be gentle on a small
machine (small heap, a short-pause collector, few threads) and convenient for tests (topics
are never created by accident, consumer groups start without the initial rebalance delay).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clipstream.errors import InfraError
from clipstream.infra import file_lock, last_line, require_binary, spawn_detached
from clipstream.infra.readiness import MetadataProbe, kafka_answers  # noqa: F401 (re-exported)
from clipstream.settings import MAX_RECORD_BYTES, Settings
from topics.sizes import topic_limit

SCALA_VERSION = "2.13"
SLF4J_RELOAD4J_VERSION = "1.7.36"  # the log4j 1 binding the Kafka 3.9 distribution ships
DEPENDENCY_PLUGIN_VERSION = "3.8.1"
MARKER = "jars.ok"

JAVA_HINT = "apt-get install -y openjdk-17-jre-headless (macOS: brew install openjdk@17)"
MAVEN_HINT = "apt-get install -y openjdk-17-jre-headless maven (macOS: brew install maven)"

# A small heap with a parallel young collector: every collection stops the broker, and a query
# crosses it several times, so its pauses land in the latency tails (docs/design/0011).
# KAFKA_HEAP_OPTS and KAFKA_JVM_PERFORMANCE_OPTS override these, as for Kafka's own scripts.
BROKER_HEAP_OPTS = ["-Xmx512m", "-Xms256m"]
BROKER_PERFORMANCE_OPTS = ["-XX:+UseParallelGC", "-XX:ParallelGCThreads=2", "-XX:+ExitOnOutOfMemoryError"]
# StorageTool runs for a second: skip the optimising JIT, it only costs start-up time
TOOL_JVM_OPTS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]

# Settings for development and tests, on top of the KRaft essentials.
DEV_BROKER_PROPERTIES: dict[str, str] = {
    "auto.create.topics.enable": "false",  # a typo in a topic name fails instead of hiding
    "num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",  # consumers in tests start at once
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "8",  # 50 by default: slow first group join
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "log.retention.hours": "6",
    "log.segment.bytes": str(64 * 1024 * 1024),
    "log.retention.check.interval.ms": "60000",
    "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),  # 128 MiB by default
    # the controller's no-op record on an idle metadata log: Kafka writes one every 500 ms,
    # and each runs through the raft log, the controller and the metadata publishers
    # (docs/design/0047)
    "metadata.max.idle.interval.ms": "30000",
    # the largest record any CLIPSTREAM_MAX_RECORD_BYTES allows, for topics made without a limit
    # of their own (the topics clipstream makes carry the setting's: topics.sizes)
    "message.max.bytes": str(topic_limit(MAX_RECORD_BYTES)),
}


def kafka_home(settings: Settings) -> Path:
    """Where the pom, the jars and the marker of one Kafka version live (shared by state dirs)."""
    return Path(settings.cache_dir).expanduser() / f"kafka-{settings.kafka_version}"


def render_pom(kafka_version: str) -> str:
    """A pom whose runtime dependencies are exactly the broker's classpath."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.clipstream</groupId>
  <artifactId>kafka-broker-jars</artifactId>
  <version>{kafka_version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{SCALA_VERSION}</artifactId>
      <version>{kafka_version}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-reload4j</artifactId>
      <version>{SLF4J_RELOAD4J_VERSION}</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>{DEPENDENCY_PLUGIN_VERSION}</version>
      </plugin>
    </plugins>
  </build>
</project>
"""


def jars_ready(settings: Settings) -> bool:
    """True when a previous fetch of exactly this pom completed (no network needed then)."""
    home = kafka_home(settings)
    try:
        marker = json.loads((home / MARKER).read_text())
    except (OSError, ValueError):
        return False
    expected = hashlib.sha256(render_pom(settings.kafka_version).encode()).hexdigest()
    return marker.get("pom_sha256") == expected and any((home / "libs").glob("kafka_*.jar"))


_DOWNLOADED = re.compile(r"Downloaded from \S+: (\S+) \(([\d.]+ \w*B)")


def fetch_jars(settings: Settings, progress: Callable[[str], None] = print) -> Path:
    """Fill ``<cache_dir>/kafka-<version>/libs`` with the broker's jars; return that folder.

    A second call finds the marker written after the last success and returns at once, so only
    the first run needs the network. Maven keeps its own cache in ~/.m2 as well.
    """
    home = kafka_home(settings)
    libs = home / "libs"
    if jars_ready(settings):
        return libs
    mvn = require_binary("mvn", MAVEN_HINT)
    require_binary("java", JAVA_HINT)
    home.mkdir(parents=True, exist_ok=True)
    with file_lock(home / ".lock"):
        if jars_ready(settings):  # another process fetched them while we waited
            return libs
        pom = render_pom(settings.kafka_version)
        (home / "pom.xml").write_text(pom)
        partial = home / "libs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        progress(
            f"fetching Kafka {settings.kafka_version} jars from Maven Central into {libs} "
            "(about 46 MB, a minute the first time)"
        )
        argv = [
            mvn, "-B", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}", "-DincludeScope=runtime",
        ]  # fmt: skip
        log_path = home / "maven.log"
        errors: list[str] = []
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                argv, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if match := _DOWNLOADED.search(line):
                    progress(f"  {match.group(1).rsplit('/', 1)[-1]} ({match.group(2)})")
                elif line.startswith("[ERROR]") and len(errors) < 3:
                    errors.append(line[7:].strip())
            code = proc.wait()
        if code != 0:
            why = errors[0] if errors else f"exit code {code}"
            raise InfraError(
                f"Maven could not fetch the Kafka {settings.kafka_version} jars ({why}); "
                f"check network access to Maven Central, full log: {log_path}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        partial.rename(libs)
        marker = {
            "kafka_version": settings.kafka_version,
            "pom_sha256": hashlib.sha256(pom.encode()).hexdigest(),
            "jars": sorted(p.name for p in libs.glob("*.jar")),
        }
        (home / MARKER).write_text(json.dumps(marker, indent=1))
        progress(f"Kafka jars ready: {len(marker['jars'])} jars in {libs}")
    return libs


def _prop_escape(value: str) -> str:
    """Java .properties treats backslash as an escape: keep Windows-ish paths intact."""
    return value.replace("\\", "\\\\")


def render_server_properties(
    *,
    port: int,
    controller_port: int,
    data_dir: Path,
    extra: Mapping[str, str] | None = None,
    node_id: int = 1,
    voters: str | None = None,
) -> str:
    """server.properties of a combined broker+controller node listening on 127.0.0.1 only.

    ``voters`` is the controller quorum (``id@host:port,...``; see ``cluster.quorum_voters``);
    by default the node is a quorum of one.
    """
    props: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        **DEV_BROKER_PROPERTIES,
        **(extra or {}),
    }
    return "".join(f"{key}={_prop_escape(value)}\n" for key, value in props.items())


def render_log4j(log_file: Path) -> str:
    """log4j 1 config: everything to one size-capped file, nothing to the terminal."""
    return f"""log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File={_prop_escape(str(log_file))}
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka.clients=WARN
log4j.logger.state.change.logger=WARN
"""


@dataclass(frozen=True)
class BrokerFiles:
    """The files of one broker instance, all under the state dir."""

    config: Path  # server.properties
    log4j: Path
    data_dir: Path  # log.dirs (KRaft metadata and topic data)
    log: Path  # the broker's own log (log4j)
    out: Path  # stdout/stderr of the JVM: crashes before log4j starts land here

    @classmethod
    def under(cls, state_dir: Path) -> BrokerFiles:
        return cls(
            config=state_dir / "kafka" / "server.properties",
            log4j=state_dir / "kafka" / "log4j.properties",
            data_dir=state_dir / "kafka" / "data",
            log=state_dir / "kafka.log",
            out=state_dir / "kafka.out",
        )


def write_broker_files(
    state_dir: Path, port: int, controller_port: int, extra: Mapping[str, str] | None = None
) -> BrokerFiles:
    """Write server.properties and log4j.properties for this state dir; return the paths."""
    files = BrokerFiles.under(state_dir)
    files.config.parent.mkdir(parents=True, exist_ok=True)
    files.config.write_text(
        render_server_properties(
            port=port, controller_port=controller_port, data_dir=files.data_dir, extra=extra
        )
    )
    files.log4j.write_text(render_log4j(files.log))
    return files


def random_cluster_id() -> str:
    """A cluster id as Kafka's ``Uuid.randomUuid()`` makes one, without starting a JVM."""
    while True:
        raw = uuid.uuid4().bytes
        text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        if not text.startswith("-"):  # Kafka avoids ids that look like a CLI flag
            return text


def _classpath(libs: Path) -> str:
    return str(libs / "*")  # expanded by the JVM, not the shell


def formatted_cluster_id(files: BrokerFiles) -> str | None:
    """The cluster id a data dir was formatted with; None before its first format."""
    try:
        text = (files.data_dir / "meta.properties").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    return None


def format_storage(
    java: str, libs: Path, files: BrokerFiles, cluster_id: str | None = None, scram: Sequence[str] = ()
) -> bool:
    """Format the KRaft data dir once; False when it was formatted before (data is kept).

    The nodes of one cluster must all be formatted with the same ``cluster_id``. ``scram``:
    SCRAM users to create (``SCRAM-SHA-512=[name=u,password=p]``, see ``clipstream.infra.secure``).
    """
    if (files.data_dir / "meta.properties").exists():
        return False
    tool = ["kafka.tools.StorageTool", "format", "-t", cluster_id or random_cluster_id(), "-c", str(files.config),
            "--ignore-formatted", *(arg for user in scram for arg in ("--add-scram", user))]
    argv = [java, *TOOL_JVM_OPTS, f"-Dlog4j.configuration=file:{files.log4j}", "-cp", _classpath(libs)]
    # SCRAM passwords go in a Java argument file only the owner reads, not on the command line,
    # where any local user's `ps` would see them
    argfile = files.config.parent / "format.args"
    try:
        if scram:
            argfile.unlink(missing_ok=True)  # made anew, so with the mode below
            fd = os.open(argfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write("\n".join('"' + a.replace("\\", "\\\\").replace('"', '\\"') + '"' for a in tool) + "\n")
            argv.append(f"@{argfile}")
        else:
            argv += tool
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    finally:
        argfile.unlink(missing_ok=True)
    if result.returncode != 0:
        raise InfraError(f"formatting Kafka storage in {files.data_dir} failed: {last_line(result)}; remove "
                         f"{files.data_dir} (or run `clipstream infra down`) and retry")
    return True


def broker_jvm_opts(env: Mapping[str, str] | None = None) -> list[str]:
    """The broker's heap and performance options: ours, or the KAFKA_HEAP_OPTS and
    KAFKA_JVM_PERFORMANCE_OPTS that a Kafka user already sets for ``kafka-server-start.sh``."""
    env = os.environ if env is None else env
    heap = shlex.split(env.get("KAFKA_HEAP_OPTS", "")) or BROKER_HEAP_OPTS
    perf = shlex.split(env.get("KAFKA_JVM_PERFORMANCE_OPTS", "")) or BROKER_PERFORMANCE_OPTS
    return [*heap, *perf]


def broker_command(java: str, libs: Path, files: BrokerFiles) -> list[str]:
    """The java command line of the broker."""
    return [
        java, *broker_jvm_opts(), "-Djava.awt.headless=true",
        f"-Dlog4j.configuration=file:{files.log4j}",
        "-cp", _classpath(libs), "kafka.Kafka", str(files.config),
    ]  # fmt: skip


def start_broker(
    java: str, libs: Path, files: BrokerFiles, die_with_parent: bool = False
) -> subprocess.Popen[bytes]:
    """Start the broker detached (own session), output to ``files.out``; does not wait."""
    return spawn_detached(
        broker_command(java, libs, files),
        files.out,
        cwd=files.config.parent,
        die_with_parent=die_with_parent,
    )
