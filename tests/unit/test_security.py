"""kwatermark.security: Spark's security options translated for librdkafka, without a broker.

Stores are made by the tests (tests/support/certs.py: cryptography for PKCS12/PEM, the JDK's
keytool for JKS); librdkafka itself checks that what comes out is usable (a Consumer is
created from it, which parses the PEM strings)."""

from __future__ import annotations

import pickle

import pytest
from confluent_kafka import Consumer

from kwatermark.errors import OptionError
from kwatermark.options import is_secret, parse_options
from kwatermark.security import (
    KRB5_MODULES,
    OAUTH_MODULE,
    PLAIN_MODULE,
    SCRAM_MODULE,
    check,
    librdkafka_conf,
    parse_jaas,
)
from tests.support.certs import (
    issue,
    make_ca,
    write_jks_keystore,
    write_jks_truststore,
    write_pkcs12,
)

SECRET = "Jaas-Secret-7731"


def jaas(module: str, body: str) -> str:
    return f"{module} required {body};"


def refused(conf: dict[str, str]) -> str:
    with pytest.raises(OptionError) as failure:
        librdkafka_conf(conf)
    assert SECRET not in str(failure.value)
    return str(failure.value)


# -- JAAS ------------------------------------------------------------------------------------

@pytest.mark.parametrize("module, mechanism", [(PLAIN_MODULE, "PLAIN"),
                                               (SCRAM_MODULE, "SCRAM-SHA-512")])
def test_plain_and_scram_jaas_become_username_and_password(module, mechanism):
    conf = {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
            "sasl.jaas.config": jaas(module, f'username="alice" password="{SECRET}"')}
    assert librdkafka_conf(conf) == {"security.protocol": "SASL_SSL",
                                     "sasl.mechanism": mechanism, "sasl.username": "alice",
                                     "sasl.password": SECRET}


@pytest.mark.parametrize("text, password", [
    (r'password="a\"b\\c"', 'a"b\\c'),                 # escaped quote and backslash
    (r"password='it\'s'", "it's"),                      # single quotes, as StreamTokenizer
    (r'password="tab\there\101"', "tab\there" + "A"),   # \t and octal \101
    ('password=plainWord_$-.1', "plainWord_$-.1"),      # an unquoted word
    ('password="x;y=z // not a comment"', "x;y=z // not a comment"),
])
def test_jaas_values_are_read_as_kafka_quotes_them(text, password):
    entry = parse_jaas(f"{PLAIN_MODULE} required username=\"u\" {text};")
    assert entry.options == {"username": "u", "password": password}


def test_jaas_comments_whitespace_and_flag_case_are_accepted():
    entry = parse_jaas(f"/* a comment */ {SCRAM_MODULE}\n  REQUIRED // the flag\n"
                       f'  username="u"\n  password="p" ;  ')
    assert (entry.module, entry.flag, entry.options) == (
        SCRAM_MODULE, "required", {"username": "u", "password": "p"})


@pytest.mark.parametrize("text, reason", [
    (f'{PLAIN_MODULE} required username="u" password="{SECRET}"', "must end with ';'"),
    (f'{PLAIN_MODULE} username="u" password="{SECRET}";', "needs a control flag"),
    (f'{PLAIN_MODULE} required username="u" password="{SECRET};', "not closed"),
    (f'{PLAIN_MODULE} required username password="{SECRET}";', "expected '='"),
    (f'{PLAIN_MODULE} required username=;', "no value for key username"),
    (f'{PLAIN_MODULE} required username="u" password=7{SECRET};', "quote it"),
    ("", "exactly one login module"),
    ((f'{PLAIN_MODULE} required username="a" password="{SECRET}"; '
      f'{PLAIN_MODULE} required username="b" password="{SECRET}";'), "exactly one login module"),
])
def test_malformed_jaas_is_refused_without_quoting_the_value(text, reason):
    message = refused({"sasl.mechanism": "PLAIN", "sasl.jaas.config": text})
    assert message.startswith("option kafka.sasl.jaas.config")
    assert reason in message


def test_jaas_without_a_mechanism_is_refused_as_kafka_would_use_gssapi():
    message = refused({"sasl.jaas.config": jaas(PLAIN_MODULE,
                                                f'username="u" password="{SECRET}"')})
    assert "kafka.sasl.mechanism is unset" in message and "PLAIN" in message


def test_jaas_and_librdkafka_credentials_together_are_refused():
    message = refused({"sasl.mechanism": "PLAIN", "sasl.username": "u",
                       "sasl.jaas.config": jaas(PLAIN_MODULE,
                                                f'username="u" password="{SECRET}"')})
    assert "kafka.sasl.username" in message and "set one" in message


def test_scram_delegation_tokens_are_refused():
    message = refused({"sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": jaas(
        SCRAM_MODULE, f'username="u" password="{SECRET}" tokenauth="true"')})
    assert "delegation tokens" in message


def test_unknown_login_module_is_refused_naming_librdkafka_options():
    message = refused({"sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas(
        "com.example.VaultLoginModule", f'secret="{SECRET}"')})
    assert "com.example.VaultLoginModule has no librdkafka equivalent" in message
    assert "kafka.sasl.username" in message and "kafka.sasl.oauthbearer" in message


def test_unsecured_oauthbearer_maps_to_sasl_oauthbearer_config():
    conf = librdkafka_conf({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": jaas(
        OAUTH_MODULE, 'unsecuredLoginStringClaim_sub="alice" '
                      'unsecuredLoginListClaim_scope=",read,write" '
                      'unsecuredLoginLifetimeSeconds="600" '
                      'unsecuredLoginExtension_traceId="123"')})
    assert conf == {"sasl.mechanism": "OAUTHBEARER",
                    "enable.sasl.oauthbearer.unsecure.jwt": "true",
                    "sasl.oauthbearer.config": "principal=alice lifeSeconds=600 "
                                               "scope=read,write extension_traceId=123"}


def test_oidc_client_credentials_map_to_librdkafka_oidc():
    conf = librdkafka_conf({
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.login.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        "sasl.jaas.config": jaas(OAUTH_MODULE, f'clientId="app" clientSecret="{SECRET}" '
                                               f'scope="kafka" extension_logicalCluster="lc1"')})
    assert conf == {"sasl.mechanism": "OAUTHBEARER",
                    "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
                    "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "app",
                    "sasl.oauthbearer.client.secret": SECRET,
                    "sasl.oauthbearer.scope": "kafka",
                    "sasl.oauthbearer.extensions": "logicalCluster=lc1"}


def test_a_custom_login_callback_handler_is_refused():
    message = refused({"sasl.mechanism": "OAUTHBEARER",
                       "sasl.login.callback.handler.class": "com.example.MyHandler",
                       "sasl.jaas.config": jaas(OAUTH_MODULE, f'clientSecret="{SECRET}"')})
    assert "com.example.MyHandler cannot run in librdkafka" in message
    assert "kafka.sasl.oauthbearer.method=oidc" in message


@pytest.mark.parametrize("module", KRB5_MODULES)
def test_kerberos_keytab_login_maps_to_sasl_kerberos(module):
    conf = librdkafka_conf({"sasl.mechanism": "GSSAPI", "sasl.jaas.config": jaas(
        module, 'useKeyTab=true storeKey=true keyTab="/etc/kafka/app.keytab" '
                'principal="app@EXAMPLE.COM" serviceName="kafka"')})
    assert conf == {"sasl.mechanism": "GSSAPI", "sasl.kerberos.keytab": "/etc/kafka/app.keytab",
                    "sasl.kerberos.principal": "app@EXAMPLE.COM",
                    "sasl.kerberos.service.name": "kafka"}


def test_kerberos_options_without_equivalent_are_refused():
    message = refused({"sasl.mechanism": "GSSAPI", "sasl.jaas.config": jaas(
        KRB5_MODULES[0], 'useKeyTab=true keyTab="/k" principal="p" ticketCache="/tmp/cc"')})
    assert "ticketCache" in message and "kafka.sasl.kerberos.kinit.cmd" in message


@pytest.mark.parametrize("key", ["ssl.engine.factory.class", "sasl.client.callback.handler.class",
                                 "ssl.protocol", "ssl.keymanager.algorithm"])
def test_java_only_keys_are_refused_with_what_to_use(key):
    message = refused({key: "x"})
    assert f"option kafka.{key} is not supported" in message


@pytest.mark.parametrize("given, expected", [("https", "https"), ("", "none"),
                                             ("HTTPS", "https"), ("none", "none")])
def test_endpoint_identification_keeps_kafkas_meaning(given, expected):
    conf = librdkafka_conf({"ssl.endpoint.identification.algorithm": given})
    assert conf == {"ssl.endpoint.identification.algorithm": expected}


def test_unknown_endpoint_identification_is_refused():
    assert "use 'https'" in refused({"ssl.endpoint.identification.algorithm": "ldaps"})


def test_librdkafka_names_pass_through_unchanged():
    conf = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u",
            "sasl.password": SECRET, "ssl.ca.location": "/etc/ca.pem", "client.id": "c"}
    assert librdkafka_conf(conf) == conf


# -- stores ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki():
    ca = make_ca()
    return ca, issue(ca, "client"), make_ca("another CA")


def usable_by_librdkafka(conf: dict[str, str]) -> None:
    """librdkafka parses ssl.ca.pem, ssl.certificate.pem and ssl.key.pem when the client is
    created, and checks that the key matches the certificate."""
    Consumer({**conf, "bootstrap.servers": "127.0.0.1:1", "group.id": "g",
              "security.protocol": "SSL"}).close()


@pytest.mark.parametrize("kind", ["JKS", "PKCS12", "PEM", "inline PEM"])
def test_truststores_become_ssl_ca_pem(pki, tmp_path, kind):
    ca, _, other = pki
    if kind == "JKS":
        store = {"ssl.truststore.location": str(write_jks_truststore(
            tmp_path / "t.jks", SECRET, ca)), "ssl.truststore.password": SECRET}
    elif kind == "PKCS12":
        store = {"ssl.truststore.location": str(write_pkcs12(
            tmp_path / "t.p12", SECRET, trusted=(ca, other))),
                 "ssl.truststore.password": SECRET, "ssl.truststore.type": "PKCS12"}
    elif kind == "PEM":
        (tmp_path / "ca.pem").write_text(ca.cert_pem() + other.cert_pem())
        store = {"ssl.truststore.location": str(tmp_path / "ca.pem"),
                 "ssl.truststore.type": "PEM"}
    else:
        store = {"ssl.truststore.certificates": ca.cert_pem(), "ssl.truststore.type": "PEM"}
    conf = librdkafka_conf(store)
    assert list(conf) == ["ssl.ca.pem"]
    assert ca.cert_pem() in conf["ssl.ca.pem"]
    usable_by_librdkafka(conf)


def test_a_jks_truststore_without_password_is_read_as_java_reads_it(pki, tmp_path):
    ca = pki[0]
    path = write_jks_truststore(tmp_path / "t.jks", SECRET, ca)
    assert ca.cert_pem() in librdkafka_conf({"ssl.truststore.location": str(path)})["ssl.ca.pem"]


def test_a_pkcs12_store_declared_jks_is_read_as_java_keystore_compat_does(pki, tmp_path):
    ca = pki[0]
    path = write_pkcs12(tmp_path / "t.p12", SECRET, trusted=(ca,))
    conf = librdkafka_conf({"ssl.truststore.location": str(path),
                            "ssl.truststore.password": SECRET})  # type defaults to JKS
    assert ca.cert_pem() in conf["ssl.ca.pem"]


@pytest.mark.parametrize("kind", ["JKS", "PKCS12"])
def test_a_wrong_truststore_password_names_the_option_not_the_password(pki, tmp_path, kind):
    ca = pki[0]
    path = (write_jks_truststore(tmp_path / "t.jks", "right-one", ca) if kind == "JKS"
            else write_pkcs12(tmp_path / "t.p12", "right-one", trusted=(ca,)))
    message = refused({"ssl.truststore.location": str(path), "ssl.truststore.type": kind,
                       "ssl.truststore.password": SECRET})
    assert "option kafka.ssl.truststore.location" in message
    assert str(path) in message and "wrong kafka.ssl.truststore.password" in message


def test_a_missing_store_names_the_option_the_path_and_the_host(tmp_path):
    message = refused({"ssl.truststore.location": str(tmp_path / "absent.jks")})
    assert "option kafka.ssl.truststore.location" in message
    assert "absent.jks" in message and "on host" in message and "every executor" in message


def same_key(pem: str, issued) -> bool:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    return (load_pem_private_key(pem.encode(), None).private_numbers()
            == issued.key.private_numbers())


@pytest.mark.parametrize("kind", ["JKS", "JKS with its own key password", "PKCS12", "PEM",
                                  "inline PEM"])
def test_keystores_become_key_and_certificate_pem(pki, tmp_path, kind):
    ca, client, _ = pki
    if kind.startswith("JKS"):
        key_password = "Key-Pa55" if "own" in kind else None
        store = {"ssl.keystore.location": str(write_jks_keystore(
            tmp_path / "k.jks", SECRET, client, ca, key_password)),
                 "ssl.keystore.password": SECRET}
        if key_password:
            store["ssl.key.password"] = key_password
    elif kind == "PKCS12":
        store = {"ssl.keystore.location": str(write_pkcs12(tmp_path / "k.p12", SECRET, client,
                                                           (ca,))),
                 "ssl.keystore.password": SECRET, "ssl.keystore.type": "PKCS12",
                 "ssl.key.password": SECRET}
    elif kind == "PEM":
        (tmp_path / "k.pem").write_text(client.key_pem(SECRET) + client.cert_pem()
                                        + ca.cert_pem())
        store = {"ssl.keystore.location": str(tmp_path / "k.pem"), "ssl.keystore.type": "PEM",
                 "ssl.key.password": SECRET}
    else:
        store = {"ssl.keystore.key": client.key_pem(SECRET), "ssl.key.password": SECRET,
                 "ssl.keystore.certificate.chain": client.cert_pem(),
                 "ssl.keystore.type": "PEM"}
    conf = librdkafka_conf(store)
    assert sorted(conf) == ["ssl.certificate.pem", "ssl.key.pem"]
    assert conf["ssl.certificate.pem"].startswith(client.cert_pem())
    assert same_key(conf["ssl.key.pem"], client)
    usable_by_librdkafka(conf)


def test_a_wrong_key_password_names_the_options(pki, tmp_path):
    ca, client, _ = pki
    path = write_jks_keystore(tmp_path / "k.jks", "store-pass", client, ca, "key-pass")
    message = refused({"ssl.keystore.location": str(path), "ssl.keystore.password": "store-pass",
                       "ssl.key.password": SECRET})
    # issue 33: the store opened with its password, so the key's password is named first
    assert message.startswith(f"option kafka.ssl.key.password: the key in {str(path)!r} does "
                              f"not open with it (kafka.ssl.keystore.password opened the "
                              f"store)"), message
    assert SECRET not in message


@pytest.mark.parametrize("conf, reason", [
    ({"ssl.truststore.location": "/t", "ssl.ca.location": "/ca"}, "set one"),
    ({"ssl.truststore.password": SECRET}, "kafka.ssl.truststore.location is not"),
    ({"ssl.truststore.location": "/t", "ssl.truststore.type": "BCFKS"}, "is not supported"),
    ({"ssl.keystore.location": "/k", "ssl.key.location": "/key"}, "set one"),
    ({"ssl.keystore.key": SECRET, "ssl.keystore.type": "PEM"}, "go together"),
])
def test_conflicting_or_incomplete_store_options_are_refused(conf, reason):
    assert reason in refused(conf)


# -- where the translation happens -----------------------------------------------------------

def test_options_are_checked_when_parsed_but_stores_are_read_where_the_client_is_made(
        pki, tmp_path):
    """The driver validates without reading the store; the pickled options carry the path,
    not the store's contents; consumer_conf() reads it in the process that calls it."""
    ca, client, _ = pki
    path = write_pkcs12(tmp_path / "k.p12", SECRET, client, (ca,))
    raw = {"kafka.bootstrap.servers": "b:9093", "subscribe": "t",
           "kafka.security.protocol": "SSL", "kafka.ssl.keystore.location": str(path),
           "kafka.ssl.keystore.type": "PKCS12", "kafka.ssl.keystore.password": SECRET,
           "kafka.ssl.truststore.location": str(tmp_path / "not-yet-there.jks")}
    options = parse_options(raw)  # the truststore does not exist: not read here
    blob = pickle.dumps(options)
    assert b"PRIVATE KEY" not in blob and b"CERTIFICATE" not in blob
    (tmp_path / "not-yet-there.jks").write_bytes(
        write_jks_truststore(tmp_path / "t.jks", SECRET, ca).read_bytes())
    conf = pickle.loads(blob).consumer_conf()
    assert same_key(conf["ssl.key.pem"], client) and ca.cert_pem() in conf["ssl.ca.pem"]
    assert "ssl.keystore.location" not in conf and "ssl.keystore.password" not in conf


def test_a_bad_jaas_fails_when_options_are_parsed():
    with pytest.raises(OptionError, match="option kafka.sasl.jaas.config"):
        parse_options({"kafka.bootstrap.servers": "b:9093", "subscribe": "t",
                       "kafka.sasl.mechanism": "PLAIN",
                       "kafka.sasl.jaas.config": f"{PLAIN_MODULE} required password=\"x\""})


def test_check_reads_no_file():
    check({"ssl.truststore.location": "/nowhere/t.jks", "ssl.keystore.location": "/nowhere/k",
           "ssl.keystore.password": SECRET})


@pytest.mark.parametrize("key", ["kafka.sasl.jaas.config", "kafka.ssl.keystore.password",
                                 "kafka.ssl.truststore.password", "kafka.ssl.key.password",
                                 "kafka.ssl.keystore.key", "kafka.ssl.key.pem",
                                 "kafka.sasl.oauthbearer.client.secret",
                                 "kafka.sasl.oauthbearer.config"])
def test_secret_options_are_redacted(key):
    assert is_secret(key)


# -- who the brokers see, for authorization errors --------------------------------------------

def test_principal_hints_name_the_user_or_certificate_never_a_secret(pki, tmp_path):
    from kwatermark.security import principal_hint

    sasl = librdkafka_conf({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                            "sasl.jaas.config": jaas(PLAIN_MODULE,
                                                     f'username="bob" password="{SECRET}"')})
    assert principal_hint(sasl) == "the SASL user 'bob' (PLAIN)"
    ca, client, _ = pki
    path = write_pkcs12(tmp_path / "k.p12", SECRET, client, (ca,))
    mtls = librdkafka_conf({"security.protocol": "SSL", "ssl.keystore.location": str(path),
                            "ssl.keystore.password": SECRET})
    assert principal_hint(mtls) == "the TLS client certificate 'CN=client'"
    assert "ANONYMOUS" in principal_hint({})


def test_an_authorization_error_gets_the_principal_and_brokers_appended():
    from confluent_kafka import KafkaError

    from kwatermark.security import refusal_hint

    options = parse_options({"kafka.bootstrap.servers": "b:9093", "subscribe": "t",
                             "kafka.security.protocol": "SASL_SSL",
                             "kafka.sasl.mechanism": "SCRAM-SHA-512",
                             "kafka.sasl.username": "carol", "kafka.sasl.password": SECRET})
    hint = refusal_hint(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), options)
    assert hint == ("; not authorized for the SASL user 'carol' (SCRAM-SHA-512) on "
                    "kafka.bootstrap.servers='b:9093': grant it READ on the topic")
    assert refusal_hint(KafkaError(KafkaError._TRANSPORT), options) == ""


@pytest.mark.parametrize("text", [
    None, "", "Connect to ipv4#127.0.0.1:1 failed: Connection refused",
    "SASL authentication error: Authentication failed: Invalid username or password",
])
def test_only_a_certificate_verify_failure_is_checked_again(text):
    from kwatermark.security import tls_verify_reason

    assert tls_verify_reason(text, {}) == ""
