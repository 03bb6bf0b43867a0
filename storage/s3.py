"""S3-compatible object storage (AWS S3, MinIO, Ceph RGW...) behind the Store interface.

`s3://bucket/prefix`: keys live under `prefix/`. Endpoint, region and credentials come from
StorageSettings, else from the standard AWS environment (AWS_ENDPOINT_URL[_S3], AWS_REGION /
AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE).

Every call is retried by tenacity (exponential backoff with full jitter, one deadline per call)
on connection errors, 5xx, throttling and lost multipart uploads; botocore's own retries are off
so that there is one policy. A retried upload sends the whole object again. Permanent problems
(missing bucket, bad credentials, access denied, wrong region) fail at once with one line.
"""

from __future__ import annotations

import builtins
import functools
import io
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlparse

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

import thicket.metrics as metrics
from thicket.storage.store import StorageSettings, Store, StoreConfigError, StoreError, StoreNotAnswering, StoreUnavailable
from thicket.unreachable import nobody_listens

log = logging.getLogger("thicket.storage.s3")

T = TypeVar("T")

# Shards are a few MB: one put_object. Past ~100 MB (AWS's advice), parallel parts win on a real
# network (a single put tops out at 5 GiB); on a local one-process server they lose (bench/s3_upload.py).
MULTIPART_THRESHOLD = 128 * 2**20
PART_SIZE = 32 * 2**20

TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "NoSuchUpload",  # the server lost a multipart upload (restart): send the object again
        "ConditionalRequestConflict",  # another conditional write in flight: ask again
        "OperationAborted",
    }
)
WRONG_REGION_CODES = ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException")
TRANSIENT_ERRORS = (BotoConnectionError, HTTPClientError, IncompleteReadError, builtins.ConnectionError, TimeoutError)


def error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def http_status(err: ClientError) -> int:
    return int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def is_transient(err: BaseException) -> bool:
    if isinstance(err, ClientError):
        status = http_status(err)
        return error_code(err) in TRANSIENT_CODES or status >= 500 or status == 429
    return isinstance(err, TRANSIENT_ERRORS)


def describe(err: BaseException) -> str:
    if isinstance(err, ClientError):
        message = err.response.get("Error", {}).get("Message") or f"HTTP {http_status(err)}"
        return f"{error_code(err) or http_status(err)}: {message}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/a/b' -> ('bucket', 'a/b/'); the prefix is '' or ends with '/'."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise StoreConfigError(f"expected s3://bucket[/prefix], got {uri!r}")
    prefix = parsed.path.strip("/")
    return parsed.netloc, f"{prefix}/" if prefix else ""


def _env_secret(field: str, name: str | None) -> str | None:
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise StoreConfigError(f"storage.{field}: environment variable {name} is not set")
    return value


def credentials(settings: StorageSettings) -> dict[str, str]:
    """Explicit credentials from the environment variables the settings name, else {} (boto3's chain)."""
    key_id = _env_secret("access_key_id_env", settings.access_key_id_env)
    secret = _env_secret("secret_access_key_env", settings.secret_access_key_env)
    token = _env_secret("session_token_env", settings.session_token_env)
    if key_id is None or secret is None:
        return {}
    found = {"aws_access_key_id": key_id, "aws_secret_access_key": secret}
    return found | ({"aws_session_token": token} if token else {})


def endpoint_field(settings: StorageSettings) -> str:
    """Where the endpoint came from, as the user set it."""
    if settings.endpoint_url:
        return "storage.endpoint_url"
    return next((n for n in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if os.environ.get(n)), "the S3 endpoint")


def make_client(settings: StorageSettings) -> Any:
    config = Config(
        s3={"addressing_style": settings.addressing_style},
        retries={"mode": "standard", "total_max_attempts": 1},  # tenacity retries, under one deadline
        connect_timeout=10,
        read_timeout=60,
        max_pool_connections=32,
        # Default CRC trailers (botocore >= 1.36) are refused by older MinIO/Ceph; read_shard
        # verifies each shard's SHA-256 anyway.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    region = settings.region or os.environ.get("AWS_REGION") or None  # botocore reads AWS_DEFAULT_REGION
    try:
        session = boto3.session.Session(region_name=region, **credentials(settings))
        return session.client("s3", endpoint_url=settings.endpoint_url, config=config)
    except ProfileNotFound as err:
        raise StoreConfigError(f"{err}: fix AWS_PROFILE or ~/.aws/config") from None
    except (ValueError, BotoCoreError) as err:
        raise StoreConfigError(f"cannot configure the S3 client: {describe(err)}") from None


class S3Store(Store):
    list_page_size = 1000
    reads_in_flight = 16  # a GET's latency is mostly the round trip (the client pools 32 connections)

    def __init__(self, uri: str, settings: StorageSettings | None = None) -> None:
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.settings = settings or StorageSettings()
        self.client = make_client(self.settings)
        self.endpoint: str = self.client.meta.endpoint_url
        self.transfer = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=PART_SIZE)
        self._retry_until = math.inf

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its URI and settings (names of secrets, never secrets): a process that
        unpickles it opens one store, and one client, per URI and settings."""
        return reopen, (self.uri, self.settings)

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        if if_absent:
            return self._put_if_absent(key, data)
        full = self._key(key)
        self._call(f"put {key}", lambda: self._upload(full, data))
        return True

    def get(self, key: str) -> bytes:
        full = self._key(key)

        def read() -> bytes | None:
            try:
                return self._read(full)
            except ClientError as err:
                if error_code(err) == "NoSuchKey":
                    return None
                raise

        data = self._call(f"get {key}", read)
        if data is None:
            raise StoreError(f"no object {key!r} in {self.uri}")
        return data

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def size(self, key: str) -> int:
        found = self._head(key)
        if found is None:
            raise StoreError(f"no object {key!r} in {self.uri}")
        return found

    def list(self, prefix: str = "") -> Iterator[str]:
        full = self.prefix + self._relative(prefix, allow_empty=True)

        def keys() -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full, PaginationConfig={"PageSize": self.list_page_size}
            )
            return [obj["Key"][len(self.prefix) :] for page in pages for obj in page.get("Contents", [])]

        return iter(sorted(self._call(f"list {prefix or '/'}", keys)))

    def delete(self, key: str) -> None:
        full = self._key(key)
        self._call(f"delete {key}", lambda: self.client.delete_object(Bucket=self.bucket, Key=full))

    def check(self) -> None:
        """One cheap authenticated request: the bucket exists and these credentials may list it.
        Nothing listening at the endpoint for startup_connect_s is a wrong endpoint (StoreConfigError)."""
        try:
            self._call("check", lambda: self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1),
                       startup=True)
        except StoreUnavailable as err:
            reason = nobody_listens(err.__cause__) if err.__cause__ is not None else None
            if reason is None:
                raise
            raise StoreNotAnswering(
                f"{endpoint_field(self.settings)}: nothing answers at {self.endpoint} ({reason}, for "
                f"{self.settings.startup_connect_s:g}s): check the URL and that the server is running"
            ) from None

    # -- requests ---------------------------------------------------------------------------

    def _upload(self, full: str, data: bytes) -> None:
        if len(data) < MULTIPART_THRESHOLD:
            self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
        else:
            self.client.upload_fileobj(io.BytesIO(data), self.bucket, full, Config=self.transfer)

    def _put_if_absent(self, key: str, data: bytes) -> bool:
        full = self._key(key)
        attempts = 0

        def attempt() -> bool:
            nonlocal attempts
            attempts += 1
            try:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
                return True
            except ClientError as err:
                if http_status(err) == 412:
                    return False
                raise

        if self._call(f"put {key}", attempt):
            return True
        # It exists. If an earlier attempt of ours landed but its answer was lost, we won.
        return attempts > 1 and self._call(f"get {key}", lambda: self._read(full)) == data

    def _read(self, full: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=full)["Body"].read()
        return body

    def _head(self, key: str) -> int | None:
        full = self._key(key)

        def head() -> int | None:
            try:
                return int(self.client.head_object(Bucket=self.bucket, Key=full)["ContentLength"])
            except ClientError as err:
                if http_status(err) == 404:
                    return None
                raise

        return self._call(f"head {key}", head)

    # -- retries and errors -----------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T], *, startup: bool = False) -> T:
        retrying = Retrying(
            stop=self._give_up(startup),
            wait=wait_random_exponential(multiplier=0.1, max=5.0),
            retry=retry_if_exception(is_transient),
            before_sleep=lambda state: self._log_retry(what, state, startup),
            reraise=True,
        )
        try:
            return retrying(fn)
        except Exception as err:
            raise self._error(what, err, retrying.statistics) from err

    def retry_until(self, deadline: float) -> None:
        self._retry_until = min(self._retry_until, deadline)

    def _give_up(self, startup: bool) -> Callable[[RetryCallState], bool]:
        """After retry_deadline_s; at start-up, also once nothing has listened for startup_connect_s."""
        deadline = stop_after_delay(self.settings.retry_deadline_s)

        def give_up(state: RetryCallState) -> bool:
            err = state.outcome.exception() if state.outcome else None
            waited = (state.seconds_since_start or 0.0) >= self.settings.startup_connect_s
            stopping = time.monotonic() >= self._retry_until
            return deadline(state) or stopping or (startup and waited and err is not None and nobody_listens(err) is not None)

        return give_up

    def _log_retry(self, what: str, state: RetryCallState, startup: bool = False) -> None:
        metrics.RETRIES.labels("storage").inc()
        err = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        reason = describe(err) if err else "?"
        # At start-up, an endpoint where nothing listens yet is reported once, when check() gives up.
        level = logging.DEBUG if startup and err is not None and nobody_listens(err) else logging.WARNING
        log.log(level, "S3 %s in %s: %s; retry %d in %.1f s", what, self.uri, reason, state.attempt_number, wait)

    def _error(self, what: str, err: Exception, stats: dict[str, Any]) -> StoreError:
        if is_transient(err):
            attempts = stats.get("attempt_number", 1)
            seconds = stats.get("delay_since_first_attempt", 0.0)
            return StoreUnavailable(
                f"S3 at {self.endpoint} kept failing for bucket {self.bucket!r} ({what}: {describe(err)}) "
                f"after {attempts} attempts over {seconds:.0f} s: check the endpoint and network"
            )
        if isinstance(err, NoCredentialsError | PartialCredentialsError):
            return StoreConfigError(
                f"no usable AWS credentials for bucket {self.bucket!r}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or storage.access_key_id_env)"
            )
        if isinstance(err, ClientError):
            return self._client_error(what, err)
        return StoreError(f"S3 {what} in {self.uri} failed: {describe(err)}")

    def _client_error(self, what: str, err: ClientError) -> StoreError:
        code, status = error_code(err), http_status(err)
        where = f"bucket {self.bucket!r} at {self.endpoint}"
        if code == "NoSuchBucket":
            return StoreConfigError(
                f"bucket {self.bucket!r} does not exist at {self.endpoint}: create it or fix output"
            )
        if code == "InvalidAccessKeyId":
            return StoreConfigError(
                f"{where} rejected the access key (InvalidAccessKeyId): fix AWS_ACCESS_KEY_ID or AWS_PROFILE "
                "(or storage.access_key_id_env)"
            )
        if code == "SignatureDoesNotMatch":
            return StoreConfigError(
                f"{where} rejected the signature (SignatureDoesNotMatch): fix AWS_SECRET_ACCESS_KEY "
                "(or storage.secret_access_key_env)"
            )
        if code in ("ExpiredToken", "InvalidToken", "TokenRefreshRequired"):
            return StoreConfigError(f"{where} refused the session token ({code}): refresh AWS_SESSION_TOKEN")
        if code in WRONG_REGION_CODES or status == 301:
            return StoreConfigError(
                f"{where} is in another region ({code or status}): set AWS_REGION or storage.region"
            )
        if code == "InvalidBucketName":
            return StoreConfigError(f"{where}: invalid bucket name: fix output")
        if code in ("AccessDenied", "AllAccessDisabled", "AccountProblem") or status == 403:
            return StoreConfigError(
                f"access denied to {where} ({code or status}): grant s3:ListBucket, s3:GetObject, "
                "s3:PutObject and s3:DeleteObject on it, or fix the credentials"
            )
        return StoreError(f"S3 {what} in {self.uri} failed: {describe(err)}")

    # -- keys -------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return self.prefix + self._relative(key, allow_empty=False)

    def _relative(self, key: str, *, allow_empty: bool) -> str:
        if not key and allow_empty:
            return ""
        segments = (key.removesuffix("/") if allow_empty else key).split("/")  # a listing prefix may end with '/'
        if any(s in ("", ".", "..") for s in segments):
            raise StoreError(f"key {key!r} escapes the store at {self.uri}")
        return key


@functools.cache
def reopen(uri: str, settings: StorageSettings) -> S3Store:
    return S3Store(uri, settings)
