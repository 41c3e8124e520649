/**
 * A command as a fix hint asks it to be run as root: as it is when this process is root, else
 * through `su -c` (a fresh Debian has no sudo; su keeps the directory, so relative paths hold).
 */
export function asRoot(cmd: string, root: boolean = process.getuid?.() === 0): string {
  return root ? cmd : `su -c '${cmd}'`;
}
