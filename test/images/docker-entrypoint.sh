#!/bin/sh
# docker-entrypoint.sh of the test lab's postgres image (test/images -set postgres): a small
# stand-in, for busybox's sh, of the official postgres image's entrypoint
# (github.com/docker-library/postgres, docker-entrypoint.sh). It keeps that script's interface:
# POSTGRES_PASSWORD, POSTGRES_USER, POSTGRES_DB, POSTGRES_INITDB_ARGS, POSTGRES_HOST_AUTH_METHOD,
# PGDATA, PGPORT and /docker-entrypoint-initdb.d's *.sql and *.sh files. Not kept: the *_FILE
# variables, POSTGRES_INITDB_WALDIR, compressed init files, --help and the like skipping the
# setup, and nss_wrapper for a uid with no account.
set -eu

# A first argument that is an option is one for postgres; any other command just runs.
case ${1:-} in -*) set -- postgres "$@" ;; esac
if [ "${1:-}" != postgres ]; then exec "$@"; fi
shift

export PGDATA="${PGDATA:-/var/lib/postgresql/data}"
POSTGRES_USER=${POSTGRES_USER:-postgres}
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
POSTGRES_PASSWORD=${POSTGRES_PASSWORD:-}
POSTGRES_HOST_AUTH_METHOD=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}

# The data directory (0700) and the socket directory, owned by postgres; as root, this script
# then runs again as postgres (the official one uses gosu; busybox's su keeps the environment but
# HOME, SHELL, USER and LOGNAME).
mkdir -p "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA" 2>/dev/null || :
if [ "$(id -u)" = 0 ]; then
	chmod 3777 /var/run/postgresql
	find "$PGDATA" /var/run/postgresql \! -user postgres -exec chown postgres:postgres {} +
	exec su -s /bin/sh -- postgres "$0" postgres "$@"
fi

# sql ARGS: psql on the temporary server's socket, stopping at the first error.
sql() {
	PGHOST= PGHOSTADDR= psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc "$@"
}

if [ -s "$PGDATA/PG_VERSION" ]; then
	echo "PostgreSQL Database directory appears to contain a database; Skipping initialization"
else
	if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
		cat >&2 <<-'EOF'
			Error: Database is uninitialized and superuser password is not specified.
			       You must specify POSTGRES_PASSWORD to a non-empty value for the
			       superuser. For example, "-e POSTGRES_PASSWORD=password" on "docker run".

			       You may also use "POSTGRES_HOST_AUTH_METHOD=trust" to allow all
			       connections without a password. This is *not* recommended.
		EOF
		exit 1
	fi
	pwfile=
	if [ -n "$POSTGRES_PASSWORD" ]; then
		pwfile=$(mktemp)
		printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	fi
	# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of arguments, as in the official script
	initdb --username="$POSTGRES_USER" ${pwfile:+--pwfile="$pwfile"} ${POSTGRES_INITDB_ARGS:-}
	if [ -n "$pwfile" ]; then rm -f "$pwfile"; fi
	printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"

	# A temporary server on the Unix socket only, for the database and the init files.
	export PGPASSWORD="$POSTGRES_PASSWORD"
	pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p ${PGPORT:-5432}" -w start
	if [ "$POSTGRES_DB" != postgres ]; then
		sql --dbname postgres --set db="$POSTGRES_DB" <<-'EOSQL'
			CREATE DATABASE :"db" ;
		EOSQL
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case $f in
		*.sh)
			# Executable scripts run; the others are sourced, as in the official script.
			if [ -x "$f" ]; then
				echo "$0: running $f"
				"$f"
			else
				echo "$0: sourcing $f"
				. "$f"
			fi
			;;
		*.sql)
			echo "$0: running $f"
			sql --dbname "$POSTGRES_DB" -f "$f"
			;;
		*) if [ -e "$f" ]; then echo "$0: ignoring $f"; fi ;;
		esac
	done
	pg_ctl -D "$PGDATA" -m fast -w stop
	unset PGPASSWORD
	echo "PostgreSQL init process complete; ready for start up."
fi

exec postgres "$@"
