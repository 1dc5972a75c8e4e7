#!/usr/bin/env bash
# Installs the Debian tools the tests exercise for real (and chromium, which renders report.html),
# only when missing and only as root with apt.
set -u
want=()
command -v faketime >/dev/null 2>&1 || want+=(faketime)
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || want+=(openssh-server)
command -v tc >/dev/null 2>&1 || want+=(iproute2)
command -v iperf3 >/dev/null 2>&1 || want+=(iperf3)
command -v shellcheck >/dev/null 2>&1 || want+=(shellcheck)
command -v chromium >/dev/null 2>&1 || want+=(chromium)  # the report page's headless browser test
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null 2>&1 || want+=(mosquitto)  # the MQTT transport's broker
# A search's shared study (--study postgresql://): the tests start their own server in a temporary folder.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || want+=(postgresql)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: missing ${want[*]} (need root + apt to install); the tests that use them will skip"
  exit 0
fi
echo "installing system packages: ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
apt-get install -y -qq "${want[@]}" >/dev/null 2>&1 || echo "note: apt-get install ${want[*]} failed; dependent tests will skip"
exit 0
