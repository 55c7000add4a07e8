package resident

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// trimBinary asks the kernel to page out the read-only mappings of this
// process's executable (MADV_PAGEOUT, Linux 5.4 and later). Package
// initialisation touches most of a Go binary (its code, type descriptors
// and the function table), about 30 MB of a worker's 38 at rest, and
// little of it runs again. The kernel leaves alone every page another
// process maps too (a worker beside dev, run from the same file), and
// only drops clean file pages, which a later use reads back from the
// page cache or the file: never lost, only slower once.
func trimBinary() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to page out its start-up pages: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return fmt.Errorf("read this process's mappings to page out its binary's start-up pages: %w", err)
	}
	found := false
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// start-end perms offset dev inode path
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[5] != exe || strings.Contains(f[1], "w") {
			continue
		}
		start, end, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		from, err1 := strconv.ParseUint(start, 16, 64)
		to, err2 := strconv.ParseUint(end, 16, 64)
		if err1 != nil || err2 != nil || to <= from {
			continue
		}
		found = true
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(from), uintptr(to-from), unix.MADV_PAGEOUT); errno != 0 {
			return fmt.Errorf("page out %s's start-up pages (%s): %w; they stay resident until the system reclaims them", exe, f[0], errno)
		}
	}
	if !found {
		// The binary replaced since it started shows as "(deleted)".
		return fmt.Errorf("no read-only mapping of %s in /proc/self/maps (was it replaced since this process started?); its start-up pages stay resident until the system reclaims them", exe)
	}
	return nil
}
