#!/usr/bin/env bash
# Put Hearth in the desktop's app menu: install resources/hearth.desktop, pointing at the bundle's
# absolute path, and the icon, for the current user.
#
#   packaging/install-desktop-entry.sh                 # the bundle in dist/Hearth
#   packaging/install-desktop-entry.sh /opt/Hearth     # a bundle elsewhere
#   packaging/install-desktop-entry.sh --uninstall
#
# Files: $XDG_DATA_HOME (default ~/.local/share)/applications/hearth.desktop and
# icons/hicolor/{256x256/apps/hearth.png,scalable/apps/hearth.svg}. The file name matches
# QGuiApplication.setDesktopFileName("hearth"), so Wayland compositors match the window to it.
set -euo pipefail

cd "$(dirname "$0")/.."
share=${XDG_DATA_HOME:-$HOME/.local/share}
desktop=$share/applications/hearth.desktop
png=$share/icons/hicolor/256x256/apps/hearth.png
svg=$share/icons/hicolor/scalable/apps/hearth.svg

refresh() {
    command -v update-desktop-database >/dev/null && update-desktop-database -q "$share/applications" || true
}

if [[ ${1:-} == --uninstall ]]; then
    rm -f "$desktop" "$png" "$svg"
    refresh
    echo "removed $desktop and the icons"
    exit 0
fi

bundle=${1:-dist/Hearth}
if [[ ! -x $bundle/Hearth ]]; then
    echo "error: no $bundle/Hearth; build the bundle first (packaging/build.sh)" >&2
    exit 1
fi
exe=$(cd "$bundle" && pwd)/Hearth
# Desktop Entry spec: quote the path; inside quotes escape " ` $ and \ with a backslash.
quoted=$(printf '%s' "$exe" | sed -e 's/[\\"`$]/\\&/g')

mkdir -p "$(dirname "$desktop")" "$(dirname "$png")" "$(dirname "$svg")"
install -m 644 resources/hearth.png "$png"
install -m 644 resources/hearth.svg "$svg"
while IFS= read -r line; do
    case $line in
        Exec=*) line="Exec=\"$quoted\"" ;;
        TryExec=*) line="TryExec=$exe" ;;
    esac
    printf '%s\n' "$line"
done <resources/hearth.desktop >"$desktop.tmp"
chmod 644 "$desktop.tmp"
mv "$desktop.tmp" "$desktop"
if command -v desktop-file-validate >/dev/null; then
    desktop-file-validate "$desktop"
fi
refresh
echo "installed $desktop (Exec: $exe)"
