"""Spark's security options (the Java Kafka client's) translated for librdkafka (DESIGN §18).

Spark users configure a secured cluster with the Java client's names: ``security.protocol``,
``sasl.mechanism``, ``sasl.jaas.config``, ``ssl.truststore.*``, ``ssl.keystore.*``,
``ssl.key.password`` and ``ssl.endpoint.identification.algorithm``. librdkafka has no JAAS
and no Java keystores, so this module turns them into librdkafka's own properties:

* a JAAS ``PlainLoginModule``/``ScramLoginModule`` entry becomes ``sasl.username`` and
  ``sasl.password``; ``OAuthBearerLoginModule`` and ``Krb5LoginModule`` become
  ``sasl.oauthbearer.*``/``sasl.kerberos.*``; anything else is refused, naming the librdkafka
  options to use instead;
* truststores and keystores (JKS, PKCS12, PEM) are read in memory and handed over as PEM
  strings (``ssl.ca.pem``, ``ssl.certificate.pem``, ``ssl.key.pem``), never written to disk.

Where: options are validated on the driver (:func:`check`, which reads no file), but a
store is read by :func:`librdkafka_conf` in the process that creates the client, as Spark's
Java client reads it in each executor. The pickled reader carries the path and password the
user gave, never a store's contents, and a store must exist at that path on every executor.

librdkafka's own names (``sasl.username``, ``ssl.ca.location``, ...) pass through unchanged.

>>> librdkafka_conf({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
...     "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule '
...                         'required username="alice" password="alice-secret";'})
... # doctest: +NORMALIZE_WHITESPACE
{'security.protocol': 'SASL_SSL', 'sasl.mechanism': 'PLAIN', 'sasl.username': 'alice',
 'sasl.password': 'alice-secret'}
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kwatermark.errors import OptionError

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
KRB5_MODULES = ("com.sun.security.auth.module.Krb5LoginModule",
                "com.ibm.security.auth.module.Krb5LoginModule")
# Kafka's own OIDC login handler (client credentials grant): librdkafka's
# sasl.oauthbearer.method=oidc does the same, so naming it needs no Java.
OIDC_HANDLERS = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
)

# Java-client keys with no librdkafka meaning: what to use instead.
JAVA_ONLY = {
    "sasl.client.callback.handler.class":
        "librdkafka cannot load Java classes; give the credentials with kafka.sasl.username "
        "and kafka.sasl.password (PLAIN, SCRAM), kafka.sasl.oauthbearer.* (OAUTHBEARER) or "
        "kafka.sasl.kerberos.* (GSSAPI)",
    "sasl.login.class":
        "librdkafka cannot load Java classes; use kafka.sasl.oauthbearer.* (OAUTHBEARER) or "
        "kafka.sasl.kerberos.* (GSSAPI)",
    "ssl.engine.factory.class": "librdkafka cannot load Java classes; give the certificates "
                                "with kafka.ssl.truststore.*/kafka.ssl.keystore.* or "
                                "kafka.ssl.ca.location/kafka.ssl.certificate.location/"
                                "kafka.ssl.key.location",
    "ssl.provider": "librdkafka uses OpenSSL; see kafka.ssl.engine.id for an OpenSSL engine",
    "ssl.protocol": "librdkafka uses OpenSSL, which negotiates the highest TLS version both "
                    "sides support; restrict it with kafka.ssl.cipher.suites (OpenSSL syntax)",
    "ssl.enabled.protocols": "librdkafka uses OpenSSL, which negotiates the highest TLS "
                             "version both sides support",
    "ssl.keymanager.algorithm": "librdkafka uses OpenSSL; it has no Java key managers",
    "ssl.trustmanager.algorithm": "librdkafka uses OpenSSL; it has no Java trust managers",
    "ssl.secure.random.implementation": "librdkafka uses OpenSSL's random number generator",
}

STORE_TYPES = ("JKS", "PKCS12", "PEM")
_JKS_MAGIC = b"\xfe\xed\xfe\xed"
_JAAS_FLAGS = ("required", "requisite", "sufficient", "optional")


@dataclass(frozen=True)
class JaasEntry:
    """One login module of a ``sasl.jaas.config``: ``Module flag key="value" ... ;``."""

    module: str
    flag: str
    options: dict[str, str]


# --- JAAS ------------------------------------------------------------------------------------

_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _tokens(text: str) -> list[tuple[str, str]]:
    """Kafka parses sasl.jaas.config with java.io.StreamTokenizer (JaasConfig): words of
    letters, digits, ``. - _ $``; values quoted with ``"`` or ``'`` with backslash escapes
    (octal too); ``//`` and ``/* */`` comments. Returns (kind, text): kind is "word",
    "quoted" or the character itself."""
    tokens: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c in "\"'":
            value, i = _quoted(text, i + 1, c)
            tokens.append(("quoted", value))
        elif c.isalnum() or c in "._-$" or ord(c) >= 128:
            start = i
            while i < n and (text[i].isalnum() or text[i] in "._-$" or ord(text[i]) >= 128):
                i += 1
            tokens.append(("word", text[start:i]))
        else:
            tokens.append((c, c))
            i += 1
    return tokens


def _quoted(text: str, i: int, quote: str) -> tuple[str, int]:
    out: list[str] = []
    n = len(text)
    while i < n and text[i] != quote:
        c = text[i]
        if c in "\r\n":  # StreamTokenizer ends a quoted string at the end of a line
            raise OptionError("option kafka.sasl.jaas.config: a quoted value is not closed "
                              "before the end of the line")
        if c == "\\" and i + 1 < n:
            nxt = text[i + 1]
            octal = re.match(r"[0-7]{1,3}", text[i + 1:i + 4])
            if octal:
                digits = octal.group(0)
                if len(digits) == 3 and digits[0] > "3":  # at most \377, as StreamTokenizer
                    digits = digits[:2]
                out.append(chr(int(digits, 8)))
                i += 1 + len(digits)
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    if i >= n:
        raise OptionError("option kafka.sasl.jaas.config: a quoted value is not closed")
    return "".join(out), i + 1


def parse_jaas(text: str) -> JaasEntry:
    """The single login module of a ``sasl.jaas.config`` value, as Kafka's JaasConfig reads
    it. Error messages never quote values (they may be passwords).

    >>> parse_jaas('org.apache.kafka.common.security.scram.ScramLoginModule required '
    ...            'username="alice" password="a\\\\"b";').options
    {'username': 'alice', 'password': 'a"b'}
    """
    option = "option kafka.sasl.jaas.config"
    tokens = _tokens(text)
    entries: list[JaasEntry] = []
    pos = 0
    while pos < len(tokens):
        kind, module = tokens[pos]
        if kind != "word":
            raise OptionError(f"{option}: expected a login module class name, e.g. "
                              f"'{PLAIN_MODULE} required username=\"...\" password=\"...\";'")
        if pos + 1 >= len(tokens) or tokens[pos + 1][0] != "word" \
                or tokens[pos + 1][1].lower() not in _JAAS_FLAGS:
            raise OptionError(f"{option}: login module {module} needs a control flag "
                              f"({', '.join(_JAAS_FLAGS)}) after its name")
        flag = tokens[pos + 1][1].lower()
        pos += 2
        options: dict[str, str] = {}
        while True:
            if pos >= len(tokens):
                raise OptionError(f"{option}: the entry of {module} must end with ';'")
            kind, key = tokens[pos]
            if kind == ";":
                pos += 1
                break
            if kind != "word":
                raise OptionError(f"{option}: expected key=\"value\" in the entry of {module}")
            if pos + 1 >= len(tokens) or tokens[pos + 1][0] != "=":
                raise OptionError(f"{option}: expected '=' after key {key} of {module}")
            if pos + 2 >= len(tokens) or tokens[pos + 2][0] not in ("word", "quoted"):
                raise OptionError(f"{option}: no value for key {key} of {module}")
            value_kind, value = tokens[pos + 2]
            if value_kind == "word" and (value[:1].isdigit() or value[:1] in ".-"):
                # StreamTokenizer reads an unquoted leading digit as a number, which Kafka
                # refuses ("Value not specified for key")
                raise OptionError(f"{option}: the value of key {key} of {module} starts with "
                                  f"a digit, '.' or '-': quote it (key=\"...\")")
            options[key] = value
            pos += 3
        entries.append(JaasEntry(module, flag, options))
    if len(entries) != 1:
        raise OptionError(f"{option}: must hold exactly one login module (as Kafka's clients "
                          f"require), found {len(entries)}")
    return entries[0]


def _sasl_from_jaas(conf: Mapping[str, str], out: dict[str, str]) -> None:
    text = conf["sasl.jaas.config"]
    entry = parse_jaas(text)
    mechanism = conf.get("sasl.mechanism", "GSSAPI").strip().upper()
    opts = dict(entry.options)
    where = f"option kafka.sasl.jaas.config ({entry.module.rsplit('.', 1)[-1]})"
    given = [f"kafka.{k}" for k in ("sasl.username", "sasl.password") if k in conf]
    if entry.module in (PLAIN_MODULE, SCRAM_MODULE):
        if given:
            raise OptionError(f"{where} and {' and '.join(given)} both give credentials: "
                              f"set one or the other")
        if mechanism == "GSSAPI" and "sasl.mechanism" not in conf:
            raise OptionError(f"{where} gives a username and password, but kafka.sasl.mechanism "
                              f"is unset (Kafka's default is GSSAPI): set it to PLAIN, "
                              f"SCRAM-SHA-256 or SCRAM-SHA-512")
        if opts.pop("tokenauth", "false").lower() == "true":
            raise OptionError(f"{where}: tokenauth=true (delegation tokens) has no librdkafka "
                              f"equivalent; use a SCRAM user's kafka.sasl.username and "
                              f"kafka.sasl.password")
        for key in ("username", "password"):
            if key not in opts:
                raise OptionError(f"{where} has no {key}=\"...\"")
            out[f"sasl.{key}"] = opts.pop(key)
        if opts:
            raise OptionError(f"{where}: unknown key(s) {', '.join(sorted(opts))}; librdkafka "
                              f"takes only a username and a password")
    elif entry.module == OAUTH_MODULE:
        _oauthbearer(opts, conf, out, where)
    elif entry.module in KRB5_MODULES:
        _kerberos(opts, out, where)
    else:
        raise OptionError(f"{where}: login module {entry.module} has no librdkafka "
                          f"equivalent; use kafka.sasl.username/kafka.sasl.password (PLAIN, "
                          f"SCRAM), kafka.sasl.oauthbearer.* (OAUTHBEARER) or "
                          f"kafka.sasl.kerberos.* (GSSAPI)")


def _oauthbearer(opts: dict[str, str], conf: Mapping[str, str], out: dict[str, str],
                 where: str) -> None:
    """Kafka's unsecured JWT options (``unsecuredLogin*``) → librdkafka's
    ``sasl.oauthbearer.config`` with ``enable.sasl.oauthbearer.unsecure.jwt``; the OIDC
    client-credentials options (``clientId``, ``clientSecret``, ``scope``, ``extension_*``
    with Kafka's OIDC login handler and ``sasl.oauthbearer.token.endpoint.url``) →
    ``sasl.oauthbearer.method=oidc`` and its client options."""
    extensions = {k[len("extension_"):]: opts.pop(k) for k in list(opts)
                  if k.startswith("extension_")}
    if "clientId" in opts or "clientSecret" in opts:
        handler = conf.get("sasl.login.callback.handler.class", "")
        if handler and handler not in OIDC_HANDLERS:
            raise OptionError(f"option kafka.sasl.login.callback.handler.class: {handler} "
                              f"cannot run in librdkafka; its OIDC login "
                              f"(kafka.sasl.oauthbearer.method=oidc) replaces Kafka's "
                              f"OAuthBearerLoginCallbackHandler")
        out["sasl.oauthbearer.method"] = "oidc"
        for java, native in (("clientId", "client.id"), ("clientSecret", "client.secret"),
                             ("scope", "scope")):
            if java in opts:
                out[f"sasl.oauthbearer.{native}"] = opts.pop(java)
        if extensions:
            out["sasl.oauthbearer.extensions"] = ",".join(f"{k}={v}"
                                                          for k, v in extensions.items())
    else:
        parts = []
        claims = {"unsecuredLoginStringClaim_sub": "principal",
                  "unsecuredLoginPrincipalClaimName": "principalClaimName",
                  "unsecuredLoginScopeClaimName": "scopeClaimName",
                  "unsecuredLoginLifetimeSeconds": "lifeSeconds",
                  "unsecuredLoginListClaim_scope": "scope",
                  "unsecuredLoginStringClaim_scope": "scope"}
        for java, native in claims.items():
            if java in opts:
                value = opts.pop(java)
                if native == "scope" and java.startswith("unsecuredLoginListClaim"):
                    # Kafka's list claim: its first character is the separator
                    value = ",".join(v for v in value[1:].split(value[:1]) if v)
                parts.append(f"{native}={value}")
        parts += [f"extension_{k}={v}" for k, v in extensions.items()]
        parts += [f"extension_{k[len('unsecuredLoginExtension_'):]}={opts.pop(k)}"
                  for k in list(opts) if k.startswith("unsecuredLoginExtension_")]
        if not parts:
            raise OptionError(f"{where}: neither unsecuredLoginStringClaim_sub (unsecured "
                              f"JWT) nor clientId/clientSecret (OIDC) is given; use "
                              f"kafka.sasl.oauthbearer.method=oidc with "
                              f"kafka.sasl.oauthbearer.client.id/client.secret/"
                              f"token.endpoint.url")
        out["enable.sasl.oauthbearer.unsecure.jwt"] = "true"
        out["sasl.oauthbearer.config"] = " ".join(parts)
    if opts:
        raise OptionError(f"{where}: key(s) {', '.join(sorted(opts))} have no librdkafka "
                          f"equivalent; see librdkafka's sasl.oauthbearer.* properties")


# Krb5LoginModule flags that say what librdkafka does anyway: it logs in with kinit from a
# keytab (sasl.kerberos.kinit.cmd) and keeps the ticket in the default cache.
_KRB5_IMPLIED = ("useKeyTab", "storeKey", "doNotPrompt", "useTicketCache", "renewTGT",
                 "refreshKrb5Config", "isInitiator", "debug")


def _kerberos(opts: dict[str, str], out: dict[str, str], where: str) -> None:
    for java, native in (("keyTab", "keytab"), ("principal", "principal"),
                         ("serviceName", "service.name")):
        if java in opts:
            out[f"sasl.kerberos.{native}"] = opts.pop(java)
    for key in _KRB5_IMPLIED:
        opts.pop(key, None)
    if opts:
        raise OptionError(f"{where}: key(s) {', '.join(sorted(opts))} have no librdkafka "
                          f"equivalent; see kafka.sasl.kerberos.kinit.cmd, "
                          f"kafka.sasl.kerberos.keytab and kafka.sasl.kerberos.principal")


# --- stores ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Store:
    """Where a store's bytes come from: a file (``location``) or inline PEM text."""

    option: str          # the option to name in errors, e.g. "kafka.ssl.truststore.location"
    store_type: str      # JKS, PKCS12 or PEM
    location: str | None = None
    inline: str | None = None


def _store_type(conf: Mapping[str, str], which: str) -> str:
    name = f"ssl.{which}.type"
    raw = conf.get(name, "JKS").strip().upper()  # Kafka's default type is JKS
    if raw not in STORE_TYPES:
        raise OptionError(f"option kafka.{name}: {conf[name]!r} is not supported; use one of "
                          f"{', '.join(STORE_TYPES)}")
    return raw


def _read(store: _Store) -> bytes:
    if store.inline is not None:
        return store.inline.encode()
    assert store.location is not None
    try:
        with open(store.location, "rb") as handle:
            return handle.read()
    except OSError as exc:
        host = os.uname().nodename
        raise OptionError(f"option {store.option}: cannot read {store.location!r} on host "
                          f"{host}: {exc.strerror} (the file must exist at this path on the "
                          f"driver and on every executor)") from None


def _pem_certs(certs: list) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding

    return "".join(cert.public_bytes(Encoding.PEM).decode() for cert in certs)


def _pem_key(key) -> str:
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()


def _kind(data: bytes, declared: str) -> str:
    """Java's keystore.type.compat lets a JKS-typed store be PKCS12 and the reverse: so do
    we, by the file's first bytes."""
    if declared == "PEM":
        return "PEM"
    return "JKS" if data.startswith(_JKS_MAGIC) else "PKCS12"


def _store_failure(store: _Store, password_option: str, what: str) -> OptionError:
    source = repr(store.location) if store.location else "the inline PEM"
    return OptionError(f"option {store.option}: cannot read {source} as a {store.store_type} "
                       f"{what}: wrong {password_option}, or not a {store.store_type} file")


def _key_failure(store: _Store, key_password_given: bool) -> OptionError:
    """The store opened but its private key did not: name the key's password."""
    source = repr(store.location) if store.location else "the inline PEM"
    if key_password_given:
        opened = ("" if store.store_type == "PEM" and store.location is None else
                  " (kafka.ssl.keystore.password opened the store)"
                  if store.store_type != "PEM" else "")
        return OptionError(f"option kafka.ssl.key.password: the key in {source} does not open "
                           f"with it{opened}")
    return OptionError(f"option kafka.ssl.key.password: the key in {source} is encrypted and "
                       f"does not open with kafka.ssl.keystore.password: set "
                       f"kafka.ssl.key.password")


def read_truststore(store: _Store, password: str | None) -> str:
    """The trusted certificates of a truststore, as concatenated PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import pkcs12

    data = _read(store)
    kind = _kind(data, store.store_type)
    failure = _store_failure(store, "kafka.ssl.truststore.password", "truststore")
    try:
        if kind == "PEM":
            certs = x509.load_pem_x509_certificates(data)
        elif kind == "JKS":
            import jks

            keystore = jks.KeyStore.loads(data, password, try_decrypt_keys=False)
            certs = [x509.load_der_x509_certificate(entry.cert)
                     for entry in keystore.certs.values()]
            # Java trusts a key entry's certificate chain too
            certs += [x509.load_der_x509_certificate(cert)
                      for entry in keystore.private_keys.values() for _, cert in
                      entry.cert_chain]
        else:
            loaded = pkcs12.load_pkcs12(data, password.encode() if password else None)
            certs = [c.certificate for c in loaded.additional_certs]
            if loaded.cert is not None:
                certs.append(loaded.cert.certificate)
    except Exception:  # noqa: BLE001 - pyjks and cryptography raise many types; one
        # message names the option and the password to check, and never the library's text
        raise failure from None
    if not certs:
        raise OptionError(f"option {store.option}: no certificate in {store.location!r}")
    return _pem_certs(certs)


def read_keystore(store: _Store, store_password: str | None, key_password: str | None
                  ) -> tuple[str, str]:
    """The private key (unencrypted PKCS#8 PEM, kept in memory only) and its certificate
    chain (PEM, leaf first) of a keystore holding exactly one key entry."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key, pkcs12

    data = _read(store)
    kind = _kind(data, store.store_type)
    password_option = ("kafka.ssl.key.password" if kind == "PEM"
                       else "kafka.ssl.keystore.password/kafka.ssl.key.password")
    failure = _store_failure(store, password_option, "keystore")
    try:
        if kind == "PEM":
            text = data.decode()
            if store.inline is not None:  # ssl.keystore.key: the key; the chain is separate
                key_text, chain_text = text, ""
            else:
                key_text, chain_text = text, text
            block = re.search(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?-----END "
                              r"\1PRIVATE KEY-----", key_text, re.DOTALL)
            if block is None:
                raise ValueError("no private key")
            try:
                key = load_pem_private_key(block.group(0).encode(),
                                           key_password.encode() if key_password else None)
            except (ValueError, TypeError):
                raise _key_failure(store, True) from None
            chain = x509.load_pem_x509_certificates(chain_text.encode()) if chain_text else []
        elif kind == "JKS":
            import jks

            keystore = jks.KeyStore.loads(data, store_password, try_decrypt_keys=False)
            entries = list(keystore.private_keys.values())
            if len(entries) != 1:
                raise OptionError(f"option {store.option}: {store.location!r} holds "
                                  f"{len(entries)} private keys; librdkafka presents one: "
                                  f"keep only the client's key in this keystore")
            entry = entries[0]
            # Kafka decrypts the key with ssl.key.password, else the store password
            try:
                entry.decrypt(key_password if key_password is not None else store_password)
            except Exception:  # noqa: BLE001 - pyjks's many types; never its text
                raise _key_failure(store, key_password is not None) from None
            from cryptography.hazmat.primitives.serialization import load_der_private_key

            key = load_der_private_key(entry.pkey_pkcs8, None)
            chain = [x509.load_der_x509_certificate(cert) for _, cert in entry.cert_chain]
        else:
            loaded = pkcs12.load_pkcs12(data, store_password.encode() if store_password
                                        else None)
            if loaded.key is None or loaded.cert is None:
                raise OptionError(f"option {store.option}: {store.location!r} holds no "
                                  f"private key with its certificate")
            key = loaded.key
            chain = [loaded.cert.certificate] + [c.certificate for c in loaded.additional_certs]
    except OptionError:
        raise
    except Exception:  # noqa: BLE001 - see read_truststore
        raise failure from None
    return _pem_key(key), _pem_certs(chain)


@functools.lru_cache(maxsize=16)
def _cached_truststore(store: _Store, password: str | None, stamp: tuple) -> str:
    return read_truststore(store, password)


@functools.lru_cache(maxsize=16)
def _cached_keystore(store: _Store, store_password: str | None, key_password: str | None,
                     stamp: tuple) -> tuple[str, str]:
    return read_keystore(store, store_password, key_password)


def _stamp(store: _Store) -> tuple:
    """A file's identity for the cache: a rewritten (rotated) store is read again."""
    if store.location is None:
        return ()
    try:
        st = os.stat(store.location)
    except OSError:
        return ("missing",)  # _read reports it
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _truststore(conf: Mapping[str, str]) -> _Store | None:
    location, inline = conf.get("ssl.truststore.location"), conf.get(
        "ssl.truststore.certificates")
    if location is None and inline is None:
        if "ssl.truststore.password" in conf:
            raise OptionError("option kafka.ssl.truststore.password is set but "
                              "kafka.ssl.truststore.location is not")
        return None
    if location is not None and inline is not None:
        raise OptionError("options kafka.ssl.truststore.location and "
                          "kafka.ssl.truststore.certificates conflict; set one")
    for native in ("ssl.ca.location", "ssl.ca.pem"):
        if native in conf:
            raise OptionError(f"options kafka.{native} and kafka.ssl.truststore.* both give "
                              f"the trusted certificates; set one")
    store_type = _store_type(conf, "truststore")
    if inline is not None:
        if store_type != "PEM":
            raise OptionError("option kafka.ssl.truststore.certificates needs "
                              "kafka.ssl.truststore.type=PEM")
        return _Store("kafka.ssl.truststore.certificates", "PEM", inline=inline)
    return _Store("kafka.ssl.truststore.location", store_type, location=location)


def _keystore(conf: Mapping[str, str]) -> _Store | None:
    location = conf.get("ssl.keystore.location")
    chain, key = conf.get("ssl.keystore.certificate.chain"), conf.get("ssl.keystore.key")
    if location is None and chain is None and key is None:
        if "ssl.keystore.password" in conf:
            raise OptionError("option kafka.ssl.keystore.password is set but "
                              "kafka.ssl.keystore.location is not")
        return None
    for native in ("ssl.certificate.location", "ssl.certificate.pem", "ssl.key.location",
                   "ssl.key.pem"):
        if native in conf:
            raise OptionError(f"options kafka.{native} and kafka.ssl.keystore.* both give "
                              f"the client's certificate; set one")
    store_type = _store_type(conf, "keystore")
    if location is not None:
        if chain is not None or key is not None:
            raise OptionError("option kafka.ssl.keystore.location conflicts with "
                              "kafka.ssl.keystore.certificate.chain/kafka.ssl.keystore.key")
        return _Store("kafka.ssl.keystore.location", store_type, location=location)
    if chain is None or key is None or store_type != "PEM":
        raise OptionError("options kafka.ssl.keystore.certificate.chain and "
                          "kafka.ssl.keystore.key go together, with kafka.ssl.keystore.type=PEM")
    return _Store("kafka.ssl.keystore.key", "PEM", inline=key)


_STORE_KEYS = ("ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type",
               "ssl.truststore.certificates", "ssl.keystore.location",
               "ssl.keystore.password", "ssl.keystore.type", "ssl.keystore.certificate.chain",
               "ssl.keystore.key")


def _ssl(conf: Mapping[str, str], out: dict[str, str], read_stores: bool) -> None:
    for key in _STORE_KEYS:
        out.pop(key, None)
    trust = _truststore(conf)
    keys = _keystore(conf)
    # ssl.key.password is librdkafka's too (for ssl.key.location/ssl.key.pem): keep it
    # for them, consume it for a keystore.
    if keys is not None:
        out.pop("ssl.key.password", None)
    if not read_stores:
        return
    if trust is not None:
        out["ssl.ca.pem"] = _cached_truststore(trust, conf.get("ssl.truststore.password"),
                                               _stamp(trust))
    if keys is not None:
        key, chain = _cached_keystore(keys, conf.get("ssl.keystore.password"),
                                      conf.get("ssl.key.password"), _stamp(keys))
        if keys.inline is not None:
            from cryptography import x509

            try:
                chain = _pem_certs(x509.load_pem_x509_certificates(
                    conf["ssl.keystore.certificate.chain"].encode()))
            except ValueError:
                raise OptionError("option kafka.ssl.keystore.certificate.chain: not PEM "
                                  "certificates") from None
        out["ssl.key.pem"] = key
        out["ssl.certificate.pem"] = chain


# --- the translation -------------------------------------------------------------------------

def _translate(raw: Mapping[str, str], read_stores: bool) -> dict[str, str]:
    # Spark hands a data source its option names lower-cased; librdkafka's are lower case
    conf = {k.lower(): v for k, v in raw.items()}
    out = dict(conf)
    for key, reason in JAVA_ONLY.items():
        if key in conf:
            raise OptionError(f"option kafka.{key} is not supported: {reason}")
    handler = conf.get("sasl.login.callback.handler.class")
    if handler is not None:
        jaas = conf.get("sasl.jaas.config", "")
        if handler not in OIDC_HANDLERS or OAUTH_MODULE not in jaas:
            raise OptionError(f"option kafka.sasl.login.callback.handler.class: {handler} "
                              f"cannot run in librdkafka (no Java); for OIDC use "
                              f"kafka.sasl.oauthbearer.method=oidc with "
                              f"kafka.sasl.oauthbearer.client.id/client.secret/"
                              f"token.endpoint.url")
        out.pop("sasl.login.callback.handler.class")
    if "sasl.jaas.config" in conf:
        out.pop("sasl.jaas.config")
        _sasl_from_jaas(conf, out)
    if "ssl.endpoint.identification.algorithm" in conf:
        value = conf["ssl.endpoint.identification.algorithm"].strip().lower()
        if value not in ("", "https", "none"):
            raise OptionError(f"option kafka.ssl.endpoint.identification.algorithm: "
                              f"{conf['ssl.endpoint.identification.algorithm']!r} is not "
                              f"supported; use 'https' (verify the broker's host name, the "
                              f"default) or '' (do not)")
        # Kafka's empty value means "do not verify"; librdkafka spells that "none"
        out["ssl.endpoint.identification.algorithm"] = value or "none"
    _ssl(conf, out, read_stores)
    return out


def check(conf: Mapping[str, str]) -> None:
    """Validate the security options of ``conf`` (kafka.* without the prefix) without
    reading any file: called when options are parsed on the driver. Raises OptionError."""
    _translate(conf, read_stores=False)


def librdkafka_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with Spark's security options replaced by librdkafka's, stores read in
    memory (cached per process until the file changes). Called where a client is created."""
    return _translate(conf, read_stores=True)



def principal_hint(conf: Mapping[str, str]) -> str:
    """Who the brokers see, as far as a translated (librdkafka) configuration tells, for
    errors: the brokers' principal mapping may rename it. Never a secret."""
    protocol = conf.get("security.protocol", "plaintext").lower()
    if protocol.startswith("sasl"):
        mechanism = conf.get("sasl.mechanism", "GSSAPI").upper()
        if mechanism == "GSSAPI":
            return f"the Kerberos principal {conf.get('sasl.kerberos.principal', 'kafkaclient')!r}"
        if mechanism == "OAUTHBEARER":
            return "the OAUTHBEARER token's principal"
        return f"the SASL user {conf.get('sasl.username', '')!r} ({mechanism})"
    if protocol == "ssl":
        pem = conf.get("ssl.certificate.pem")
        if pem:
            from cryptography import x509

            try:
                subject = x509.load_pem_x509_certificate(pem.encode()).subject.rfc4514_string()
            except ValueError:
                subject = "?"
            return f"the TLS client certificate {subject!r}"
        if conf.get("ssl.certificate.location"):
            return "the TLS client certificate of kafka.ssl.certificate.location"
    return "the anonymous principal (User:ANONYMOUS: no client credentials)"


_AUTHORIZATION_CODES = {"TOPIC_AUTHORIZATION_FAILED": "READ on the topic",
                        "GROUP_AUTHORIZATION_FAILED": "READ on the consumer group",
                        "CLUSTER_AUTHORIZATION_FAILED": "the cluster operation"}


def refusal_hint(error, options) -> str:
    """For a Kafka error of an authorization kind, ``"; not authorized for <principal> on
    kafka.bootstrap.servers=...: grant it ..."`` (else ""), to append to the error's text.
    ``error``: a confluent_kafka KafkaError; ``options``: the source's SourceOptions."""
    grant = _AUTHORIZATION_CODES.get(error.name())
    if grant is None:
        return ""
    return (f"; not authorized for {principal_hint(options.consumer_conf())} on "
            f"kafka.bootstrap.servers={options.bootstrap_servers!r}: grant it {grant}")


_TLS_ADDRESS = re.compile(r"\b(?:sasl_)?ssl://(\[[^\]]+\]|[^:/\s]+):(\d+)")


def tls_verify_reason(error_text: str, conf: Mapping[str, str], timeout_s: float = 5.0) -> str:
    """librdkafka words every failed check of the broker's certificate alike ("certificate
    verify failed: broker certificate could not be verified"): an unknown CA and a host
    name mismatch read the same. For such an error, redo the handshake with Python's ssl
    (same CA, same host name rule) and return OpenSSL's own reason, e.g. ``"; the
    certificate of 127.0.0.1:9093 failed kwatermark's check: Hostname mismatch, certificate
    is not valid for '127.0.0.1'."``; "" when it cannot tell."""
    import socket
    import ssl

    found = _TLS_ADDRESS.search(error_text or "")
    if "certificate verify failed" not in (error_text or "") or found is None:
        return ""
    host, port = found.group(1).strip("[]"), int(found.group(2))
    try:
        context = ssl.create_default_context(cafile=conf.get("ssl.ca.location"),
                                             cadata=conf.get("ssl.ca.pem"))
        context.check_hostname = conf.get("ssl.endpoint.identification.algorithm",
                                          "https") == "https"
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                context.wrap_socket(raw, server_hostname=host):
            return ""
    except ssl.SSLCertVerificationError as exc:
        return (f"; the certificate of {host}:{port} failed kwatermark's check: "
                f"{exc.verify_message}")
    except (OSError, ValueError):  # not reachable now, or a CA file Python cannot read
        return ""


# --- refusals that no retry mends (issue 33) --------------------------------------------------

_SASL_FAILED = re.compile(r"SASL authentication (?:error|failed)|Authentication failed",
                          re.IGNORECASE)
# A TLS listener with ssl.client.auth=required: the broker's alert, as OpenSSL names it
# (TLS 1.3 "certificate required", TLS 1.2 "bad certificate"/"handshake failure").
_CERT_REQUIRED = re.compile(r"alert certificate required|alert bad certificate|"
                            r"alert handshake failure|peer did not return a certificate",
                            re.IGNORECASE)
_UNTRUSTED = re.compile(r"self.signed certificate|unable to get local issuer|"
                        r"unable to verify the first certificate|certificate has expired|"
                        r"not yet valid|unable to get issuer", re.IGNORECASE)
_HOST = re.compile(r"(?:Hostname|IP address) mismatch, certificate is not valid for "
                   r"'([^']*)'", re.IGNORECASE)


def refusal_cause(text: str, conf: Mapping[str, str], verified: str = "", jaas: bool = True
                  ) -> str | None:
    """The cause of a connection failure that no retry mends, in the user's options' terms,
    or None when ``text`` (librdkafka's words for why a connection failed) is not one.

    ``conf``: the translated (librdkafka) configuration the client used; ``verified``: what
    a handshake of kwatermark's own said of the broker's certificate
    (:func:`tls_verify_reason`), which tells an unknown CA from a host name mismatch where
    librdkafka words both alike; ``jaas``: the credentials came in ``kafka.sasl.jaas.config``
    (else librdkafka's ``kafka.sasl.password``). Never returns a secret.

    >>> refusal_cause("SASL authentication error: Authentication failed: Invalid "
    ...     "username or password", {"sasl.username": "alice", "sasl.mechanism": "PLAIN",
    ...     "security.protocol": "sasl_ssl"})
    "authentication failed for SASL user 'alice' (PLAIN): check the password in kafka.sasl.jaas.config"
    """
    trust = ("kafka.ssl.truststore.location" if conf.get("ssl.ca.pem") is not None
             and conf.get("ssl.ca.location") is None else "kafka.ssl.ca.location"
             if conf.get("ssl.ca.location") else "kafka.ssl.truststore.location (none is set: "
             "the system's CAs were used)")
    if "certificate verify failed" in text:
        host = _HOST.search(verified)
        if host:
            return (f"the broker's certificate is not valid for host {host.group(1)}: use a "
                    f"name in its certificate in kafka.bootstrap.servers (or set "
                    f"kafka.ssl.endpoint.identification.algorithm to empty)")
        if _UNTRUSTED.search(verified) or not verified:
            reason = verified.rsplit(": ", 1)[-1].rstrip(".") if verified else \
                "certificate verify failed"
            return (f"the broker's certificate is not signed by a CA in {trust} "
                    f"({reason})")
        return f"the broker's certificate was refused: {verified.rsplit(': ', 1)[-1]}"
    if _SASL_FAILED.search(text) and "SASL" in text.upper():
        mechanism = conf.get("sasl.mechanism", "GSSAPI").upper()
        user = conf.get("sasl.username")
        if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            where = "kafka.sasl.jaas.config" if jaas else "kafka.sasl.password"
            return (f"authentication failed for SASL user {user!r} ({mechanism}): check the "
                    f"password in {where}")
        return f"SASL authentication failed ({mechanism}): check kafka.sasl.* credentials"
    if _CERT_REQUIRED.search(text) and "ssl" in conf.get("security.protocol", "").lower():
        if not conf.get("ssl.certificate.pem") and not conf.get("ssl.certificate.location"):
            return ("the listener wants a client certificate: set "
                    "kafka.ssl.keystore.location (kafka.ssl.keystore.*)")
        return ("the broker refused the client certificate of kafka.ssl.keystore.*: is it "
                "signed by a CA the broker's ssl.truststore trusts, and still valid?")
    return None
