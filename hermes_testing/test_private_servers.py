"""The private servers fault tests stop and kill: data survives, ports are private."""

import psycopg
import pytest
import redis

from hermes_testing.private_servers import PrivatePostgres, PrivateRedis

pytestmark = pytest.mark.skipif(
    not (PrivatePostgres.available() and PrivateRedis.available()),
    reason="needs the PostgreSQL server binaries and redis-server",
)


@pytest.mark.slow
def test_private_postgres_survives_stop_and_kill():
    with PrivatePostgres() as pg:
        assert pg.port != 5432
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1)")
        held = psycopg.connect(pg.url, autocommit=True)
        pg.kill()
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg.url, connect_timeout=2)
        pg.start()
        with psycopg.connect(pg.url, autocommit=True) as conn:
            assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
        pg.stop()
        pg.start()
        with psycopg.connect(pg.url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_private_redis_stops_and_starts_on_its_port():
    with PrivateRedis() as rd:
        client = redis.Redis.from_url(rd.url)
        assert client.ping()
        rd.kill()
        with pytest.raises(redis.ConnectionError):
            client.ping()
        rd.start()
        assert client.ping()
        client.close()
