package vmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Lines DiskCheckScript prints.
const (
	// CheckOK is printed when everything written was read back intact.
	CheckOK = "HERD-VM-CHECK ok"
	// CheckFailPrefix starts the line printed on the first failure,
	// followed by the reason.
	CheckFailPrefix = "HERD-VM-CHECK FAIL"
)

// Sizes of the DiskCheckScript pattern.
const (
	// Mebibyte is the unit of DiskCheckScript's megabytes: 1 MiB.
	Mebibyte = 1 << 20
	// EndMarkerSize is the size of the marker written at the end of the
	// disk.
	EndMarkerSize = 4096
)

// DiskCheckScript returns a guest script (for Options.GuestScript) that
// proves the guest's writes, flushes and reads reach the disk:
//
//  1. It checks that /dev/vda holds at least megabytes MiB plus
//     EndMarkerSize bytes.
//  2. It writes ExpectedPattern(seed, megabytes) to the first megabytes MiB
//     of /dev/vda, one MiB per dd: the even-numbered MiB in ascending order
//     through the page cache with conv=fsync (each fsync becomes a FLUSH),
//     then the odd-numbered MiB in descending order with O_DIRECT and no
//     flush of their own.
//  3. It writes ExpectedEndMarker(seed) to the last EndMarkerSize bytes of
//     the disk (offset blockdev --getsize64 minus EndMarkerSize), with fsync.
//  4. It flushes (sync /dev/vda, which fsyncs the device and sends a FLUSH,
//     then blockdev --flushbufs) and drops the guest's caches
//     (echo 3 > /proc/sys/vm/drop_caches).
//  5. It reads the first megabytes MiB back twice, through the page cache
//     and with O_DIRECT, and the end marker once, and compares them with
//     what it wrote (md5sum and cmp; on a mismatch it finds the first bad
//     MiB).
//  6. It prints CheckOK ("HERD-VM-CHECK ok") and exits 0, or prints
//     "HERD-VM-CHECK FAIL <reason>" and exits 1.
//
// Only busybox applets are used. After the VM has exited, the same bytes can
// be checked from the host: the first megabytes*Mebibyte bytes of the export
// must equal ExpectedPattern(seed, megabytes), the last EndMarkerSize bytes
// ExpectedEndMarker(seed); VerifyFromHost checks both. Characters of seed
// outside printable ASCII are replaced by '_' (in the script and in the
// expected bytes alike). A megabytes below 1 counts as 1.
func DiskCheckScript(seed string, megabytes int) string {
	megabytes = max(megabytes, 1)
	return fmt.Sprintf(diskCheckTemplate, shellQuote(sanitizeSeed(seed)), megabytes, Mebibyte, EndMarkerSize)
}

// diskCheckTemplate is DiskCheckScript's text; the arguments are the quoted
// seed, the number of MiB, the MiB size and the end marker size.
const diskCheckTemplate = `# herd vmtest disk check: write, flush, drop caches, read back, compare.
seed=%s
megabytes=%d
mebibyte=%d
end_size=%d
disk=${DISK:-/dev/vda}

fail() {
	echo "HERD-VM-CHECK FAIL $*"
	exit 1
}

# block N prints MiB number N of the pattern.
block() {
	yes "herd-vm-check seed=$seed mebibyte=$1" | head -c $mebibyte
}

# end_marker prints the marker for the end of the disk.
end_marker() {
	yes "herd-vm-check seed=$seed end-of-disk" | head -c $end_size
}

# pattern prints the whole pattern for the first megabytes MiB.
pattern() {
	i=0
	while [ $i -lt $megabytes ]; do
		block $i
		i=$((i + 1))
	done
}

[ -b "$disk" ] || fail "$disk is not a block device"
size=$(blockdev --getsize64 "$disk") || fail "blockdev --getsize64 $disk"
need=$((megabytes * mebibyte + end_size))
[ "$size" -ge "$need" ] || fail "$disk has $size bytes, the check needs $need"
echo "herd-vm-check: $disk has $size bytes; writing $megabytes MiB and an end marker"

# Even MiB, ascending, through the page cache, each fsync'ed.
i=0
while [ $i -lt $megabytes ]; do
	block $i > /tmp/block || fail "generating MiB $i"
	dd if=/tmp/block of="$disk" bs=$mebibyte seek=$i count=1 conv=notrunc,fsync 2> /tmp/dd.log ||
		fail "writing MiB $i: $(cat /tmp/dd.log)"
	i=$((i + 2))
done
# Odd MiB, descending, with O_DIRECT and no flush of their own.
i=$((megabytes - 1))
[ $((i %% 2)) -eq 1 ] || i=$((i - 1))
while [ $i -ge 1 ]; do
	block $i > /tmp/block || fail "generating MiB $i"
	dd if=/tmp/block of="$disk" bs=$mebibyte seek=$i count=1 conv=notrunc oflag=direct 2> /tmp/dd.log ||
		fail "writing MiB $i: $(cat /tmp/dd.log)"
	i=$((i - 2))
done
rm -f /tmp/block

end_marker > /tmp/end || fail "generating the end marker"
end_sectors=$((end_size / 512))
end_sector=$((size / 512 - end_sectors))
dd if=/tmp/end of="$disk" bs=512 seek=$end_sector count=$end_sectors conv=notrunc,fsync 2> /tmp/dd.log ||
	fail "writing the end marker at sector $end_sector: $(cat /tmp/dd.log)"

sync "$disk" || fail "sync $disk"
blockdev --flushbufs "$disk" || fail "blockdev --flushbufs $disk"
sync
echo 3 > /proc/sys/vm/drop_caches || fail "dropping caches"

expected=$(pattern | md5sum) || fail "hashing the pattern"
expected=${expected%%%% *}

# first_bad_mebibyte FLAG prints the first MiB that differs, read with FLAG.
first_bad_mebibyte() {
	i=0
	while [ $i -lt $megabytes ]; do
		block $i > /tmp/block
		dd if="$disk" bs=$mebibyte skip=$i count=1 $1 2> /dev/null | cmp -s - /tmp/block || {
			echo $i
			return
		}
		i=$((i + 1))
	done
	echo none
}

for flag in "" iflag=direct; do
	actual=$(dd if="$disk" bs=$mebibyte count=$megabytes $flag 2> /tmp/dd.log | md5sum) ||
		fail "reading back ${flag:-buffered}: $(cat /tmp/dd.log)"
	actual=${actual%%%% *}
	if [ "$actual" != "$expected" ]; then
		fail "read back ${flag:-buffered} differs (md5 $actual, want $expected), first bad MiB: $(first_bad_mebibyte "$flag")"
	fi
	echo 3 > /proc/sys/vm/drop_caches
done

dd if="$disk" bs=512 skip=$end_sector count=$end_sectors 2> /tmp/dd.log | cmp -s - /tmp/end ||
	fail "the end marker at sector $end_sector reads back different: $(cat /tmp/dd.log)"

echo "HERD-VM-CHECK ok"
`

// sanitizeSeed replaces the bytes of seed outside printable ASCII by '_'.
func sanitizeSeed(seed string) string {
	sanitized := []byte(seed)
	for index, character := range sanitized {
		if character < 0x20 || character > 0x7e {
			sanitized[index] = '_'
		}
	}
	return string(sanitized)
}

// shellQuote quotes text for sh.
func shellQuote(text string) string {
	return "'" + strings.ReplaceAll(text, "'", `'\''`) + "'"
}

// repeatLine returns line plus a newline, repeated and cut to size bytes:
// what `yes LINE | head -c SIZE` prints.
func repeatLine(line string, size int) []byte {
	line += "\n"
	output := bytes.Repeat([]byte(line), size/len(line)+1)
	return output[:size]
}

// ExpectedPattern returns exactly the bytes DiskCheckScript(seed, megabytes)
// writes to the first megabytes MiB of the disk: MiB number i (from 0) is
// the line "herd-vm-check seed=SEED mebibyte=I\n" repeated and cut to
// 1 MiB, so a MiB written to the wrong place is caught too.
func ExpectedPattern(seed string, megabytes int) []byte {
	megabytes = max(megabytes, 1)
	seed = sanitizeSeed(seed)
	pattern := make([]byte, 0, megabytes*Mebibyte)
	for index := range megabytes {
		pattern = append(pattern, repeatLine(fmt.Sprintf("herd-vm-check seed=%s mebibyte=%d", seed, index), Mebibyte)...)
	}
	return pattern
}

// ExpectedEndMarker returns exactly the bytes DiskCheckScript(seed, ...)
// writes to the last EndMarkerSize bytes of the disk: the line
// "herd-vm-check seed=SEED end-of-disk\n" repeated and cut to 4096 bytes.
func ExpectedEndMarker(seed string) []byte {
	return repeatLine(fmt.Sprintf("herd-vm-check seed=%s end-of-disk", sanitizeSeed(seed)), EndMarkerSize)
}

// VerifyFromHost reads the export at nbdURI from the host, after the VM has
// exited, and returns nil if its first megabytes MiB equal
// ExpectedPattern(seed, megabytes) and its last EndMarkerSize bytes equal
// ExpectedEndMarker(seed): what DiskCheckScript(seed, megabytes) left there.
// It reads only those two ranges, with qemu-img (Debian package
// qemu-utils). nbdURI is nbd://HOST[:PORT]/EXPORT or
// nbd+unix:///EXPORT?socket=PATH.
func VerifyFromHost(ctx context.Context, nbdURI, seed string, megabytes int) error {
	megabytes = max(megabytes, 1)
	size, err := ExportSize(ctx, nbdURI)
	if err != nil {
		return err
	}
	if size < int64(megabytes)*Mebibyte+EndMarkerSize {
		return fmt.Errorf("vmtest: %s has %d bytes, too few for a %d MiB check", nbdURI, size, megabytes)
	}
	start, err := ReadFromHost(ctx, nbdURI, 0, int64(megabytes)*Mebibyte)
	if err != nil {
		return err
	}
	if err := compareBytes("the first "+strconv.Itoa(megabytes)+" MiB", start, ExpectedPattern(seed, megabytes)); err != nil {
		return err
	}
	end, err := ReadFromHost(ctx, nbdURI, size-EndMarkerSize, EndMarkerSize)
	if err != nil {
		return err
	}
	return compareBytes("the end marker", end, ExpectedEndMarker(seed))
}

// compareBytes describes the first difference between actual and expected.
func compareBytes(what string, actual, expected []byte) error {
	if bytes.Equal(actual, expected) {
		return nil
	}
	if len(actual) != len(expected) {
		return fmt.Errorf("vmtest: %s: read %d bytes, want %d", what, len(actual), len(expected))
	}
	offset := 0
	for actual[offset] == expected[offset] {
		offset++
	}
	end := min(offset+48, len(actual))
	return fmt.Errorf("vmtest: %s differ first at byte %d (MiB %d): read %q, want %q",
		what, offset, offset/Mebibyte, actual[offset:end], expected[offset:end])
}

// ExportSize returns the size of the export at nbdURI, asking qemu-img.
func ExportSize(ctx context.Context, nbdURI string) (int64, error) {
	imageOptions, err := qemuImageOptions(nbdURI, -1, -1)
	if err != nil {
		return 0, err
	}
	output, err := runQEMUImage(ctx, "info", "--output=json", "--image-opts", imageOptions)
	if err != nil {
		return 0, err
	}
	var information struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	if err := json.Unmarshal(output, &information); err != nil {
		return 0, fmt.Errorf("vmtest: qemu-img info: %w", err)
	}
	return information.VirtualSize, nil
}

// ReadFromHost returns length bytes at offset of the export at nbdURI, read
// with qemu-img convert through a raw driver limited to that range.
func ReadFromHost(ctx context.Context, nbdURI string, offset, length int64) ([]byte, error) {
	imageOptions, err := qemuImageOptions(nbdURI, offset, length)
	if err != nil {
		return nil, err
	}
	directory, err := os.MkdirTemp("", "herd-vmtest-read-")
	if err != nil {
		return nil, fmt.Errorf("vmtest: %w", err)
	}
	defer os.RemoveAll(directory)
	output := filepath.Join(directory, "range.raw")
	if _, err := runQEMUImage(ctx, "convert", "--image-opts", imageOptions, "-O", "raw", output); err != nil {
		return nil, err
	}
	contents, err := os.ReadFile(output)
	if err != nil {
		return nil, fmt.Errorf("vmtest: %w", err)
	}
	return contents, nil
}

// qemuImageOptions turns an NBD URI into qemu-img --image-opts: the raw
// driver, limited to [offset, offset+length) unless offset is negative, over
// the nbd driver.
func qemuImageOptions(nbdURI string, offset, length int64) (string, error) {
	parsed, err := url.Parse(nbdURI)
	if err != nil {
		return "", fmt.Errorf("vmtest: NBD URI %q: %w", nbdURI, err)
	}
	export := strings.TrimPrefix(parsed.Path, "/")
	options := []string{"driver=raw"}
	if offset >= 0 {
		options = append(options, "offset="+strconv.FormatInt(offset, 10), "size="+strconv.FormatInt(length, 10))
	}
	options = append(options, "file.driver=nbd")
	switch parsed.Scheme {
	case "nbd":
		port := parsed.Port()
		if port == "" {
			port = "10809"
		}
		options = append(options, "file.server.type=inet", "file.server.host="+parsed.Hostname(), "file.server.port="+port)
	case "nbd+unix":
		socket := parsed.Query().Get("socket")
		if socket == "" {
			return "", fmt.Errorf("vmtest: NBD URI %q names no socket", nbdURI)
		}
		options = append(options, "file.server.type=unix", "file.server.path="+socket)
	default:
		return "", fmt.Errorf("vmtest: NBD URI %q: only nbd:// and nbd+unix:// are supported", nbdURI)
	}
	if export != "" {
		options = append(options, "file.export="+export)
	}
	for index, option := range options {
		options[index] = escapeDriveOption(option)
	}
	return strings.Join(options, ","), nil
}

// runQEMUImage runs qemu-img and returns its standard output.
func runQEMUImage(ctx context.Context, arguments ...string) ([]byte, error) {
	path, err := exec.LookPath("qemu-img")
	if err != nil {
		return nil, errors.New("vmtest: qemu-img not found in PATH (Debian package qemu-utils)")
	}
	var errorOutput bytes.Buffer
	command := exec.CommandContext(ctx, path, arguments...)
	command.Stderr = &errorOutput
	output, err := command.Output()
	if err != nil {
		return nil, fmt.Errorf("vmtest: qemu-img %s: %v: %s", strings.Join(arguments, " "), err, strings.TrimSpace(errorOutput.String()))
	}
	return output, nil
}
