#!/bin/sh
# A Vulkan driver for ManiSkill3 (SAPIEN renders through Vulkan even for state observations).
# On a CPU-only machine that means Mesa's lavapipe. Debian 12's Mesa 22 lavapipe fails ManiSkill;
# Mesa 25 from bookworm-backports works. Elsewhere the distribution's mesa-vulkan-drivers is used.
# Needs root and apt; prints what to do otherwise. Safe to run twice. Touches no OpenGL package.
set -e
if ls /usr/share/vulkan/icd.d/nvidia_icd.json >/dev/null 2>&1; then
  echo "vulkan: NVIDIA driver present"; exit 0
fi
have=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
major=${have%%.*}
if [ -n "$have" ] && [ "${major:-0}" -ge 23 ] 2>/dev/null; then
  echo "vulkan: mesa-vulkan-drivers $have"; exit 0
fi
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
  echo "vulkan: install a Vulkan driver (Mesa >= 23 lavapipe: mesa-vulkan-drivers, libvulkan1) as root; ManiSkill needs one" >&2
  exit 1
fi
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
if [ "$codename" = bookworm ]; then
  list=/etc/apt/sources.list.d/bookworm-backports.sources
  if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > "$list"
  fi
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends -t bookworm-backports mesa-vulkan-drivers libvulkan1 >/dev/null
else
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends mesa-vulkan-drivers libvulkan1 >/dev/null
fi
echo "vulkan: mesa-vulkan-drivers $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers)"
