"""The layer over TLS (``amqps://``) against a private node with a TLS listener.

The node gets a certificate for 127.0.0.1/localhost signed by a CA made here
with ``cryptography``. The client verifies the server with pika's URL form:
``?ssl_options=`` carrying a Python dict literal, e.g.
``{'ca_certs': '/path/ca.pem'}``, which pika 1.4 turns into an
``SSLContext(PROTOCOL_TLS_CLIENT)`` (certificate and host name checked; the
host name defaults to the URL's host, so an IP SAN of 127.0.0.1 matches).
"""

import datetime
import ipaddress
import os
import shutil
import tempfile
import time
from urllib.parse import quote

import pytest
from cryptography import x509  # noqa: E402  (a test extra)
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

from asgi_amqp import BrokerConnectionError
from helpers import Management, free_port, make_layer, private_node, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.broker]  # nodes of its own, with TLS

OPERATION_TIMEOUT = 3.0


# -- certificates --------------------------------------------------------------


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _make_ca(common_name):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_server_cert(ca_key, ca_cert):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _write_pem(path, data, mode=0o644):
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _cert_pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key):
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


@pytest.fixture(scope="module")
def certs():
    """ca.pem, server.pem, server.key (and other-ca.pem, a CA that signed nothing)."""
    directory = tempfile.mkdtemp(prefix="asgiamqp-tls-")
    try:
        ca_key, ca_cert = _make_ca("asgi_amqp test CA")
        key, cert = _make_server_cert(ca_key, ca_cert)
        _, other_ca = _make_ca("asgi_amqp unrelated CA")
        paths = {
            name: os.path.join(directory, name)
            for name in ("ca.pem", "server.pem", "server.key", "other-ca.pem")
        }
        _write_pem(paths["ca.pem"], _cert_pem(ca_cert))
        _write_pem(paths["server.pem"], _cert_pem(cert))
        _write_pem(paths["server.key"], _key_pem(key), mode=0o600)
        _write_pem(paths["other-ca.pem"], _cert_pem(other_ca))
        # The node runs as user rabbitmq (when we are root): it must read the key.
        if os.geteuid() == 0:
            import pwd

            try:
                pw = pwd.getpwnam("rabbitmq")
            except KeyError:
                pw = None
            if pw is not None:
                os.chown(directory, pw.pw_uid, pw.pw_gid)
                for path in paths.values():
                    os.chown(path, pw.pw_uid, pw.pw_gid)
        os.chmod(directory, 0o755)
        yield paths
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_node(certs):
    tls_port = free_port()
    with private_node(
        extra_config=[
            "listeners.ssl.local = 127.0.0.1:%d" % tls_port,
            "ssl_options.cacertfile = %s" % certs["ca.pem"],
            "ssl_options.certfile = %s" % certs["server.pem"],
            "ssl_options.keyfile = %s" % certs["server.key"],
            "ssl_options.verify = verify_none",
            "ssl_options.fail_if_no_peer_cert = false",
        ]
    ) as node:
        node.tls_port = tls_port
        yield node


def tls_url(node, ca_file, **extra):
    """amqps:// URL that verifies the server against ``ca_file`` (pika's URL form)."""
    options = dict({"ca_certs": ca_file}, **extra)
    query = "ssl_options=" + quote(repr(options), safe="")
    return "amqps://guest:guest@127.0.0.1:%d/%%2F?%s" % (node.tls_port, query)


def _layer(factory, node, url):
    """A layer from ``factory`` (new_layer or make_layer) on ``url``, managed through ``node``."""
    return factory(
        url,
        management_url=node.management_url,
        operation_timeout=OPERATION_TIMEOUT,
        receive_timeout=1,
    )


def _connections(node):
    """(peer_port, ssl) of every client connection, from the management API."""
    return [(c.get("port"), c.get("ssl")) for c in Management(node).connections()]


def test_round_trip_over_tls_with_ca_verification(tls_node, certs, new_layer):
    layer = _layer(new_layer, tls_node, tls_url(tls_node, certs["ca.pem"]))
    layer.send("tls.chan", {"text": "over TLS", "n": 1})
    assert layer.receive(["tls.chan"], block=True) == ("tls.chan", {"text": "over TLS", "n": 1})
    # Groups go through the same connection.
    layer.group_add("tlsgroup", "tls.member")
    layer.send_group("tlsgroup", {"g": 1})
    assert layer.receive(["tls.member"], block=True) == ("tls.member", {"g": 1})
    # The broker sees the layer's connections on the TLS port, with TLS on.
    found = wait_until(
        lambda: [c for c in _connections(tls_node) if c[0] == tls_node.tls_port],
        timeout=10,
        message="a TLS connection listed",
    )
    assert all(ssl for _, ssl in found), found


def test_tls_also_works_with_localhost_as_host_name(tls_node, certs, new_layer):
    url = tls_url(tls_node, certs["ca.pem"]).replace("127.0.0.1", "localhost")
    layer = _layer(new_layer, tls_node, url)
    layer.send("tls.localhost", {"n": 2})
    assert layer.receive(["tls.localhost"]) == ("tls.localhost", {"n": 2})


@pytest.mark.parametrize(
    "case", ["wrong CA", "plain AMQP to the TLS port", "wrong server_hostname"]
)
def test_a_failed_tls_handshake_is_a_clear_error_within_seconds(tls_node, certs, case, caplog):
    if case == "wrong CA":
        url = tls_url(tls_node, certs["other-ca.pem"])
    elif case == "wrong server_hostname":
        url = tls_url(tls_node, certs["ca.pem"], server_hostname="not-this-host.example")
    else:
        url = "amqp://guest:guest@127.0.0.1:%d/%%2F" % tls_node.tls_port
    layer = _layer(make_layer, tls_node, url)
    try:
        started = time.monotonic()
        with pytest.raises(BrokerConnectionError) as caught:
            layer.send("tls.refused", {"n": 1})
        elapsed = time.monotonic() - started
        assert elapsed < OPERATION_TIMEOUT + 2.0, elapsed
        text = str(caught.value)
        # Says where, never the password.
        assert "127.0.0.1:%d" % tls_node.tls_port in text, text
        assert "guest:guest" not in text
        if case != "plain AMQP to the TLS port":
            assert "CERTIFICATE_VERIFY_FAILED" in text or "certificate" in text.lower(), text
        # The next call fails the same way, again without hanging.
        started = time.monotonic()
        with pytest.raises(BrokerConnectionError):
            layer.receive(["tls.refused"], block=True)
        assert time.monotonic() - started < 1 + OPERATION_TIMEOUT + 2.0
    finally:
        layer.close()
    # Closing while it keeps retrying the handshake is clean.
    assert not [r for r in caplog.records if "crashed" in r.getMessage()], caplog.text[-2000:]
    assert not any(thread.is_alive() for thread in layer.threads())


@pytest.mark.faults
def test_tls_layer_reconnects_after_connections_are_closed(tls_node, certs, new_layer):
    layer = _layer(new_layer, tls_node, tls_url(tls_node, certs["ca.pem"]))
    layer.send("tls.churn", {"n": 0})
    assert layer.receive(["tls.churn"]) == ("tls.churn", {"n": 0})
    tls_node.close_all_connections("tls test")

    def serving():
        try:
            layer.send("tls.churn", {"n": 1})
            return layer.receive(["tls.churn"]) == ("tls.churn", {"n": 1})
        except BrokerConnectionError:
            return False

    wait_until(serving, timeout=10, interval=0.1, message="serving over TLS again")
