// Package reach answers, before a file is handed to another user, whether
// that user (or the members of a group) can get to it at all: search
// permission (x) on every directory from / down to the file's directory.
// herd uses it where a file it writes is for a hypervisor that runs as
// another user: the local NBD socket (herd server --nbd-socket-group) and
// the TLS files of an NBD client (herd client add --owner). Without it the
// first sign of a directory the user cannot enter is QEMU's "Permission
// denied" at VM start.
//
// Only the file mode bits are read (owner, group, others), as the kernel
// applies them when no ACL is set; root passes every check.
package reach

import (
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Who is a user or the members of a group.
type Who struct {
	// Name is how messages call it: "user libvirt-qemu", "group kvm".
	Name string
	// UID is the user's id; -1 for the members of a group, whoever they
	// are (no owner bits apply to them).
	UID int
	// GIDs are the groups the user is in (its primary group first), or the
	// one group.
	GIDs []int
}

// Group is the members of group name (a name or a numeric id).
func Group(name string) (Who, error) {
	g, err := LookupGroup(name)
	if err != nil {
		return Who{}, err
	}
	gid, _ := strconv.Atoi(g.Gid)
	return Who{Name: "group " + g.Name, UID: -1, GIDs: []int{gid}}, nil
}

// LookupGroup finds a group by name, or by id when name is a number that
// names no group.
func LookupGroup(name string) (*user.Group, error) {
	g, err := user.LookupGroup(name)
	if err == nil {
		return g, nil
	}
	if _, numeric := strconv.Atoi(name); numeric == nil {
		if byID, idErr := user.LookupGroupId(name); idErr == nil {
			return byID, nil
		}
	}
	return nil, fmt.Errorf("no group %q on this host", name)
}

// Owner is what `chown USER[:GROUP]` takes: the user, and the group (the
// user's primary group when GROUP is omitted). Both may be names or
// numeric ids.
type Owner struct {
	UID, GID int
	// Who is the user, with every group it is in, for Directories.
	Who Who
}

// ParseOwner reads USER[:GROUP].
func ParseOwner(spec string) (Owner, error) {
	userName, groupName, withGroup := strings.Cut(spec, ":")
	if userName == "" || (withGroup && groupName == "") {
		return Owner{}, fmt.Errorf("%q: give USER or USER:GROUP", spec)
	}
	u, err := user.Lookup(userName)
	if err != nil {
		if _, numeric := strconv.Atoi(userName); numeric == nil {
			u, err = user.LookupId(userName)
		}
		if err != nil {
			return Owner{}, fmt.Errorf("no user %q on this host", userName)
		}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	gids := []int{gid}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if n, err := strconv.Atoi(id); err == nil && !slices.Contains(gids, n) {
				gids = append(gids, n)
			}
		}
	}
	if withGroup {
		g, err := LookupGroup(groupName)
		if err != nil {
			return Owner{}, err
		}
		gid, _ = strconv.Atoi(g.Gid)
		if !slices.Contains(gids, gid) {
			gids = append(gids, gid)
		}
	}
	return Owner{UID: uid, GID: gid, Who: Who{Name: "user " + u.Username, UID: uid, GIDs: gids}}, nil
}

// Directories returns nil when who may search every directory from / down
// to dir (dir included), else an error naming the first one that stops it,
// with its mode and owners. Directories that do not exist yet are not
// checked.
func Directories(dir string, who Who) error {
	if who.UID == 0 {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	path := "/"
	for _, part := range append([]string{""}, strings.Split(strings.TrimPrefix(abs, "/"), "/")...) {
		path = filepath.Join(path, part)
		info, err := os.Stat(path)
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if !CanSearch(info, who) {
			return fmt.Errorf("%s cannot enter %s (%s)", who.Name, path, Describe(info))
		}
	}
	return nil
}

// CanSearch says whether who may search (enter) the directory info
// describes, by its mode bits.
func CanSearch(info fs.FileInfo, who Who) bool {
	stat, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	mode := info.Mode().Perm()
	switch {
	case who.UID >= 0 && int(stat.Uid) == who.UID:
		return mode&0o100 != 0
	case slices.Contains(who.GIDs, int(stat.Gid)):
		return mode&0o010 != 0
	default:
		return mode&0o001 != 0
	}
}

// Describe says "mode 0700, owner herd, group herd" of a file.
func Describe(info fs.FileInfo) string {
	text := fmt.Sprintf("mode %04o", info.Mode().Perm())
	if stat, ok := info.Sys().(*syscall.Stat_t); ok {
		text += ", owner " + userName(int(stat.Uid)) + ", group " + groupName(int(stat.Gid))
	}
	return text
}

func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username
	}
	return strconv.Itoa(uid)
}

func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name
	}
	return strconv.Itoa(gid)
}
