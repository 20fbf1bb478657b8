"""What a store's refusal says, and what redaction leaves of it.

A refused request names what was refused and why, in words a user acts on: no credentials
found, credentials the store does not accept, credentials not allowed this request on this
bucket (a 403), a bucket that does not exist. The refusals come from real servers: moto's S3
server with IAM enforced (a second server, started here, with a user allowed to list and read
one bucket and a user allowed nothing), the GCS emulator, Azurite, Python's HTTP server and
the fake Hub. Redaction hides the values of secrets, never the words around them: real error
messages of every client come out of it as they went in.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import make_shards
from http_servers import serving
from procs import free_port

import tidal
from tidal.storage import Retry, Storage
from tidal.storage.fs import Remote
from tidal.storage.retry import describe, redact

pytest_plugins = ["s3_fixtures", "emulator_fixtures"]

FAST = Retry(attempts=2, backoff=0.01)


@dataclass
class Guarded:
    """moto's S3 server with IAM enforced, and the credentials of its two users."""

    endpoint: str
    reader: dict[str, Any]  # may list and read the bucket "bkt", nothing else
    nobody: dict[str, Any]  # may do nothing

    def storage(self, tmp: Path, who: dict[str, Any], **kwargs: Any) -> Storage:
        return Storage(options=who, cache_dir=str(tmp), retry=FAST, timeout=10, **kwargs)


def _options(endpoint: str, key: str, secret: str) -> dict[str, Any]:
    return {"key": key, "secret": secret, "endpoint_url": endpoint, "client_kwargs": {"region_name": "us-east-1"}}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    """moto's server checks every request against IAM once its first SETUP requests are done
    (``INITIAL_NO_AUTH_ACTION_COUNT``): those make the bucket, its objects and the two users."""
    import boto3
    import botocore.exceptions

    setup = 9
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(setup), "PYTHONWARNINGS": "ignore"}
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "moto's server did not start"
                time.sleep(0.05)
        root = {"endpoint_url": endpoint, "region_name": "us-east-1"}
        admin = {**root, "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE", "aws_secret_access_key": "x"}
        iam, s3 = boto3.client("iam", **admin), boto3.client("s3", **admin)
        keys = {}
        for user in ("reader", "nobody"):  # 4 requests
            iam.create_user(UserName=user)
            keys[user] = iam.create_access_key(UserName=user)["AccessKey"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::bkt"},
                {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::bkt/*"},
            ],
        }
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(policy))
        s3.create_bucket(Bucket="bkt")
        data = make_shards(tmp_path_factory.mktemp("guarded"), [5, 7, 3], kinds=("jsonl",))
        for path in sorted(data.glob("*.jsonl")):  # 3 requests: 9 in all
            s3.put_object(Bucket="bkt", Key=f"data/{path.name}", Body=path.read_bytes())
        nobody = boto3.client("s3", **root, aws_access_key_id=keys["nobody"]["AccessKeyId"], aws_secret_access_key="x")
        for _ in range(3):  # IAM is enforced from here on (a request more, if the server counted one less)
            try:
                nobody.list_objects_v2(Bucket="bkt")
            except botocore.exceptions.ClientError:
                break
        else:
            pytest.fail("moto's server does not enforce IAM")
        yield Guarded(
            endpoint,
            _options(endpoint, keys["reader"]["AccessKeyId"], keys["reader"]["SecretAccessKey"]),
            _options(endpoint, keys["nobody"]["AccessKeyId"], keys["nobody"]["SecretAccessKey"]),
        )
    finally:
        proc.terminate()
        proc.wait(10)


def test_access_denied_says_which_credentials_may_not_do_what_on_which_bucket(guarded: Guarded, tmp_path: Path) -> None:
    settings = guarded.storage(tmp_path, guarded.nobody)
    for url, verb in [
        ("s3://bkt/data/", "list"),
        ("s3://bkt/data/*.jsonl", "list"),
        ("s3://bkt/data/part-000.jsonl", "read"),
    ]:
        with pytest.raises(tidal.StorageError) as err:
            tidal.Dataset(url, storage=settings)
        message = str(err.value)
        assert message.startswith(f"{url}: "), message
        assert f"access denied (HTTP 403): the credentials in use may not {verb}" in message, message
        assert f"granted {verb} access to the bucket 'bkt'" in message, message
        assert err.value.attempts == 1  # never retried
        assert guarded.nobody["secret"] not in message
    wrong = {**guarded.reader, "key": "AKIAWRONGWRONGWRONG1"}
    with pytest.raises(tidal.StorageError, match="the store does not accept the credentials in use") as err:
        tidal.Dataset("s3://bkt/data/", storage=guarded.storage(tmp_path, wrong))
    assert "AKIAWRONGWRONGWRONG1" not in str(err.value) and "does not exist in our records" in str(err.value)


def test_credentials_that_may_read_but_not_write_read_the_data_and_write_nothing(
    guarded: Guarded, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidal.sources import remote_counting

    caplog.set_level(logging.WARNING, logger="tidal")
    for publish in (False, True):  # asked to publish: the write is refused, and the job goes on
        monkeypatch.setattr(remote_counting, "_warned", set())  # once per dataset and process: once for each here
        caplog.clear()
        settings = guarded.storage(tmp_path / str(publish), guarded.reader, publish_index=publish)
        ds = tidal.Dataset("s3://bkt/data/", storage=settings)
        assert sorted(r["id"] for r in ds) == list(range(15))
        warned = [r.getMessage() for r in caplog.records if "tidal index" in r.getMessage()]
        assert len(warned) == 1 and "run `tidal index s3://bkt/data` once" in warned[0], warned
        assert ("it may not write s3://bkt/data/.tidal-index.json" in warned[0]) is publish, warned
    import boto3

    reader = boto3.client("s3", endpoint_url=guarded.endpoint, region_name="us-east-1", **_boto(guarded.reader))
    assert sorted(o["Key"] for o in reader.list_objects_v2(Bucket="bkt")["Contents"]) == [
        f"data/part-{k:03d}.jsonl" for k in range(3)
    ]  # nothing written beside the data: no index, no claim


def test_a_conversion_into_a_bucket_it_may_not_write_says_so(guarded: Guarded, tmp_path: Path) -> None:
    from tidal.convert import convert

    src = make_shards(tmp_path / "src", [4], kinds=("jsonl",))
    with pytest.raises(tidal.StorageError) as err:
        convert(str(src), "s3://bkt/converted", dst_options=guarded.reader)
    assert "access denied (HTTP 403): the credentials in use may not " in str(err.value), err.value
    assert "access to the bucket 'bkt'" in str(err.value) and guarded.reader["secret"] not in str(err.value)


def _boto(options: dict[str, Any]) -> dict[str, str]:
    return {"aws_access_key_id": options["key"], "aws_secret_access_key": options["secret"]}


def test_no_credentials_at_all_says_so_in_full_words(
    s3: Any, bucket: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tidal.cli import main

    s3.put(bucket, "data/a.jsonl", b'{"id": 1}\n')
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    argv = ["inspect", f"s3://{bucket}/data/", "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    argv += [
        "--storage-option",
        f"endpoint_url={s3.endpoint}",
        "--storage-option",
        "client_kwargs.region_name=us-east-1",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "NoCredentialsError: Unable to locate credentials" in err and "<redacted>" not in err, err
    assert "no credentials were found" in err and "storage_options={'anon': True}" in err, err


@pytest.mark.parametrize("store", ["s3", "gcs", "azure"])
def test_a_missing_bucket_is_named_as_such_and_a_missing_object_as_such(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server = request.getfixturevalue(store)
    scheme = {"s3": "s3", "gcs": "gs", "azure": "az"}[store]
    kind = "container" if store == "azure" else "bucket"
    name = f"here-{os.getpid()}"
    server.bucket(name)
    server.put(name, "data/a.jsonl", b'{"id": 1}\n')
    settings = Storage(options=server.options(), cache_dir=str(tmp_path), retry=FAST, timeout=10)
    for url in ["nobkt/data/", "nobkt/data/a.jsonl", "nobkt/data/*.jsonl"]:
        with pytest.raises(
            tidal.SourceError, match=rf"^{scheme}://{url.replace('*', '[*]')}: the {kind} 'nobkt' does not exist$"
        ):
            tidal.Dataset(f"{scheme}://{url}", storage=settings)
    for url in [f"{name}/data/b.jsonl", f"{name}/none/"]:
        with pytest.raises(tidal.SourceError, match=rf"^{scheme}://{url}: no such file or directory$"):
            tidal.Dataset(f"{scheme}://{url}", storage=settings)


# real messages with no secret in them: redaction must leave every word
LITERAL = [
    "KeyError: 'text'",
    "NoSuchKey: An error occurred (NoSuchKey) when calling the GetObject operation: The specified key does not exist.",
    "ExpiredToken: An error occurred (ExpiredToken) when calling the ListObjectsV2 operation: The provided token has "
    "expired.",
    "SignatureDoesNotMatch: The request signature we calculated does not match the signature you provided. Check your "
    "key and signing method.",
    "PartialCredentialsError: Partial credentials found in env, missing: AWS_SECRET_ACCESS_KEY",
    "TokenRetrievalError: Error when retrieving token from sso: Token has expired and refresh failed",
    # gcsfs: HttpError of a 401 and a 403
    "HttpError: Anonymous caller does not have storage.objects.get access to the Google Cloud Storage object. "
    "Permission 'storage.objects.get' denied on resource (or it may not exist)., 401",
    "HttpError: reader@project.iam.gserviceaccount.com does not have storage.objects.list access to the Google Cloud "
    "Storage bucket. Permission 'storage.objects.list' denied on resource (or it may not exist)., 403",
    # the Hub, a gated repository
    "GatedRepoError: 401 Client Error. (Request ID: Root=1-66a1b2c3-4d5e6f)\n\nCannot access gated repo for url "
    "https://huggingface.co/api/datasets/org/web/revision/main.\nAccess to dataset org/web is restricted. You must "
    "have access to it and be authenticated to access it. Please log in.",
]


def test_redaction_hides_values_never_the_words_of_real_error_messages(
    s3: Any, bucket: str, gcs: Any, azure: Any, guarded: Guarded, tmp_path: Path
) -> None:
    from azure_server import KEY as AZURE_KEY
    from azure_server import connection_string
    from conftest import make_shards as shards
    from hf_hub_fake import FakeHub

    said: list[str] = list(LITERAL)

    def failure(remote: Remote, url: str) -> None:
        with pytest.raises(tidal.TidalError) as err:
            remote.cat(url)
        said.append(str(err.value))
        if err.value.__cause__ is not None:
            said.append(describe(err.value.__cause__))

    s3.put(bucket, "a.jsonl", b"{}\n")
    failure(Remote("s3", Storage(options=s3.options(), retry=FAST)), f"s3://{bucket}/missing.jsonl")  # NoSuchKey
    failure(Remote("s3", Storage(options=guarded.nobody, retry=FAST)), "s3://bkt/data/part-000.jsonl")  # 403
    wrong = {**guarded.reader, "key": "AKIAWRONGWRONGWRONG1"}
    failure(Remote("s3", Storage(options=wrong, retry=FAST)), "s3://bkt/data/part-000.jsonl")  # InvalidAccessKeyId
    gcs.bucket(f"{bucket}-g")
    failure(Remote("gs", Storage(options=gcs.options(), retry=FAST)), f"gs://{bucket}-g/missing.jsonl")
    azure.bucket(f"{bucket}-a")
    bad_key = {"connection_string": connection_string(azure.endpoint).replace(AZURE_KEY, "A" * 86 + "==")}
    failure(Remote("az", Storage(options=bad_key, retry=FAST)), f"az://{bucket}-a/a.jsonl")  # AuthorizationFailure
    with serving(tmp_path) as (base, _):
        failure(Remote("http", Storage(retry=FAST)), f"{base}/missing.jsonl")  # aiohttp's 404
    shards(tmp_path / "repo", [2], kinds=("jsonl",))
    with FakeHub({"org/web": {"main": tmp_path / "repo"}}) as hub:
        token = "hf_" + "q" * 34
        hf = Remote("hf", Storage(options={**hub.options(), "token": token}, retry=FAST))
        failure(hf, "hf://datasets/org/nope/x.jsonl")  # RepositoryNotFoundError
        failure(hf, "hf://datasets/org/web/missing.jsonl")  # EntryNotFoundError
    assert len(said) >= len(LITERAL) + 8  # each failure's message, and its cause's where it has one
    for text in said:
        assert redact(text) == text, f"{text!r} -> {redact(text)!r}"
    joined = "\n".join(said)
    for secret in (token, AZURE_KEY, "A" * 86, guarded.nobody["secret"], s3.options()["secret"]):
        assert secret not in joined


SECRETS = {
    "aws key id": ("the key AKIAIOSFODNN7EXAMPLE is not known", "AKIAIOSFODNN7EXAMPLE"),
    "aws secret": ("secret_access_key='wJalrXUtnFEMI/K7MDENG+bPxRfiCY'", "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"),
    "session token": ("x-amz-security-token: FwoGZXIvYXdzEJr//////////wEaDH", "FwoGZXIvYXdzEJr"),
    "signed url": ("GET https://b.s3.amazonaws.com/k?X-Amz-Signature=f00dfeed&X-Amz-Credential=AKIAX", "f00dfeed"),
    "sas token": ("sv=2022-11-02&ss=b&srt=co&sp=r&se=2030-01-01T00:00:00Z&sig=Zm9vYmFy%2Bx%3D", "Zm9vYmFy"),
    "sas url": ("az://c/k.jsonl?sv=2022-11-02&sig=Zm9vYmFy%2Bx%3D failed", "Zm9vYmFy"),
    "account key": ("AccountName=acct;AccountKey=Eby8vdM02xNOcqFl/qUwJPLl==;BlobEndpoint=http://h/acct;", "Eby8vdM02x"),
    "bearer token": ("headers={'Authorization': 'Bearer hf_abcdefghijklmnopqrstuvwxyzABCD'}", "abcdefghijklm"),
    "basic auth": ("Authorization: Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy"),
    "password in url": ("cannot reach https://alice:hunter2@host/data/a.jsonl", "hunter2"),
    "json key": ('{"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBg\\n-----END", "x": 1}', "MIIEvQ"),
    "google token": ("token ya29.a0AfH6SMBx3y-example refused", "ya29.a0AfH6SMBx3y"),
}


@pytest.mark.parametrize("case", sorted(SECRETS))
def test_redaction_still_hides_every_kind_of_secret(case: str) -> None:
    text, secret = SECRETS[case]
    assert secret not in redact(text) and redact(text) != text
