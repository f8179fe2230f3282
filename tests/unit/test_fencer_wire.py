"""The wire fencer's pure parts: which settings it takes, its encoding, and SCRAM (RFC 7677's
example). The fencing itself runs against the real broker (tests/integration/test_fencing.py)
and the secured one (tests/secure/test_secure_fencing.py)."""

from __future__ import annotations

import struct

import pytest

from eos_connectors.kafka import fencer


def test_only_settings_it_implements_take_the_wire_path():
    plain = fencer.wire_settings({"bootstrap.servers": "a:9092,[::1]:9093", "linger.ms": 0})
    assert plain.brokers == (("a", 9092), ("::1", 9093)) and plain.protocol == "PLAINTEXT" and plain.tls is None
    sasl = {"security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u"}
    scram = fencer.wire_settings({"bootstrap.servers": "a:1", **sasl, "sasl.password": "hunter2"})
    assert scram.mechanism == "SCRAM-SHA-512" and "hunter2" not in repr(scram)
    for refused in (
        {"bootstrap.servers": "a:1", "ssl.keystore.location": "k.p12"},  # a setting it does not implement
        {"bootstrap.servers": "a:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI", "sasl.username": "u"},
        {"bootstrap.servers": "a:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"},
        {"bootstrap.servers": "a:1", "security.protocol": "SSL", "ssl.ca.location": "probe"},
        {"bootstrap.servers": "a:1", "sasl.oauthbearer.client.id": "x"},
    ):
        with pytest.raises(fencer.Unsupported):
            fencer.wire_settings(refused)


def test_tls_verifies_unless_the_settings_turn_it_off(tmp_path):
    verified = fencer.wire_settings({"bootstrap.servers": "a:1", "security.protocol": "SSL"})
    assert verified.tls is not None and verified.tls.check_hostname and verified.tls.verify_mode.name == "CERT_REQUIRED"
    no_name = fencer.wire_settings(
        {"bootstrap.servers": "a:1", "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "none"}
    )
    assert no_name.tls is not None and not no_name.tls.check_hostname
    assert no_name.tls.verify_mode.name == "CERT_REQUIRED"
    off = fencer.wire_settings(
        {"bootstrap.servers": "a:1", "security.protocol": "SSL", "enable.ssl.certificate.verification": "false"}
    )
    assert off.tls is not None and off.tls.verify_mode.name == "CERT_NONE"


def test_encoding_of_the_two_requests_and_their_answers():
    assert fencer.uvarint(0) == b"\x00" and fencer.uvarint(300) == b"\xac\x02"
    assert fencer.Reader(b"\xac\x02").uvarint() == 300
    body = fencer.find_coordinator_body(["a", "bb"])
    assert body == b"\x01\x03\x02a\x03bb\x00"  # key type 1, 2 keys, compact strings, no tags
    init = fencer.init_producer_id_body("t/1", 4)
    assert init == b"\x04t/1" + struct.pack(">iqh", fencer.TXN_TIMEOUT_MS, -1, -1) + b"\x00"
    assert fencer.init_producer_id_body("t/1", 2) == b"\x04t/1" + struct.pack(">i", fencer.TXN_TIMEOUT_MS) + b"\x00"
    answer = (
        struct.pack(">i", 0) + b"\x03"  # throttle, 2 coordinators
        + b"\x02a" + struct.pack(">i", 1) + b"\x02h" + struct.pack(">ih", 9092, 0) + b"\x00\x00"
        + b"\x03bb" + struct.pack(">i", -1) + b"\x01" + struct.pack(">ih", -1, 53) + b"\x05nope\x00"
        + b"\x00"
    )  # fmt: skip
    assert fencer.parse_coordinators(fencer.Reader(answer)) == {"a": (1, "h", 9092, 0), "bb": (-1, "", -1, 53)}
    assert fencer.parse_init_producer_id(fencer.Reader(struct.pack(">ihqh", 0, 51, -1, -1) + b"\x00")) == 51


def test_scram_sha_256_matches_rfc_7677():
    scram = fencer.Scram("sha256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert scram.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert scram.final(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    scram.check(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(fencer.WireError):
        scram.check(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")  # a broker that does not know the password


def test_scram_refuses_a_first_message_that_is_not_its_own():
    scram = fencer.Scram("sha256", "u=,x", "p", nonce="abc")
    assert scram.first() == b"n,,n=u=3D=2Cx,r=abc"
    with pytest.raises(fencer.WireError):
        scram.final(b"r=zzz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")  # not our nonce
    with pytest.raises(fencer.WireError):
        scram.final(b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=1")  # too few iterations


def test_an_answer_it_cannot_read_is_a_wire_error_so_recovery_falls_back():
    """Something that is not a Kafka broker (or a broker answering garbage) on the bootstrap port:
    the wire path gives up with WireError, and ledger.fence_each then fences with producers."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))

    def answer_garbage() -> None:
        peer, _ = server.accept()
        with peer:
            size = struct.unpack(">i", peer.recv(4))[0]
            request = peer.recv(size)
            correlation = request[4:8]
            peer.sendall(struct.pack(">i", 6) + correlation + b"\x00\x00")  # ApiVersions: error 0, then nothing

    threading.Thread(target=answer_garbage, daemon=True).start()
    try:
        with pytest.raises(fencer.WireError, match="an answer it cannot read"):
            fencer.fence({"bootstrap.servers": f"127.0.0.1:{server.getsockname()[1]}"}, ["t/0"], 5)
    finally:
        server.close()
