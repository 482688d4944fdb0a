"""The development PKI of `gms standalone --secure`: kept across restarts, renewed near expiry,
private files, and certificates Python's ssl accepts for loopback host names."""

from __future__ import annotations

import ssl
import stat

from gms.security.devca import ensure_dev_pki


def test_generated_once_kept_after_and_private(tmp_path):
    directory = tmp_path / "pki"
    pki = ensure_dev_pki(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for key in (pki.ca_key, pki.server_key, pki.client_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    before = pki.server_cert.read_bytes()
    assert ensure_dev_pki(directory).server_cert.read_bytes() == before
    # Another host to cover: a new server certificate (and CA).
    assert ensure_dev_pki(directory, hosts=("127.0.0.1", "gms.local")).server_cert.read_bytes() != before


def test_a_certificate_close_to_expiry_is_renewed(tmp_path):
    pki = ensure_dev_pki(tmp_path, valid_days=10)
    before = pki.server_cert.read_bytes()
    assert ensure_dev_pki(tmp_path).server_cert.read_bytes() != before


def test_contexts_load_and_verify_the_host_names(tmp_path):
    pki = ensure_dev_pki(tmp_path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.server_cert, pki.server_key)
    client = ssl.create_default_context(cafile=str(pki.ca_cert))
    client.load_cert_chain(pki.client_cert, pki.client_key)
    for host in ("127.0.0.1", "localhost", "::1"):
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        client_side = client.wrap_bio(incoming, outgoing, server_hostname=host)
        s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        server_side = server.wrap_bio(s_in, s_out, server_side=True)
        for _ in range(10):  # pump the handshake between the two in memory
            for side in (client_side, server_side):
                try:
                    side.do_handshake()
                except ssl.SSLWantReadError:
                    pass
            s_in.write(outgoing.read())
            incoming.write(s_out.read())
        assert client_side.getpeercert()["subjectAltName"]
