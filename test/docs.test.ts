// The documentation stays inside the repository and matches it (no model files needed):
// (a) every relative markdown link in the docs resolves to a file, and its `#anchor` to a heading;
// (b) every backticked repository path in the docs exists (or is git-ignored, e.g. a downloaded model; a
//     package README may name its own files, `src/…` included, relative to the package);
// (c) every `REFERENCE.md §N` citation in the sources and docs names a `## N.` heading of docs/REFERENCE.md.
// Each failure message lists every broken reference as `file:line: what`.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** The repository's top-level directories: a backticked token starting with one of them is a path. */
const TOP_LEVEL = ['packages/', 'native/', 'docs/', 'test/', 'tools/', 'bench/', 'configs/', 'scripts/', 'examples/'];
const TOP_LEVEL_MORE = ['models/', '.ci/'];
/** Not a literal path: spaces, wildcards, braces, placeholders (`<…>`), shell variables, ellipses. */
const NOT_A_PATH = /[\s*?{}<>$…]|\.\.\.|\|/;

/** Directories never scanned for citations (dependencies, build outputs, caches, Python environments). */
const SKIP_DIRS = new Set(['node_modules', 'dist', 'build', '.git', '.cache', '.carry', 'tmp', '.venv', '__pycache__']);
const CITING_EXTENSIONS = new Set(['.ts', '.mjs', '.cc', '.h', '.py', '.md']);

/** The markdown files whose links and paths are checked, relative to the root, sorted. */
function docFiles(): string[] {
  const files = ['README.md'];
  const inDir = (dir: string, pattern: RegExp): string[] =>
    fs.existsSync(path.join(ROOT, dir))
      ? fs
          .readdirSync(path.join(ROOT, dir))
          .filter((f) => pattern.test(f))
          .map((f) => `${dir}/${f}`)
      : [];
  files.push(...inDir('docs', /\.md$/));
  for (const group of ['packages', 'examples']) {
    for (const pkg of fs.existsSync(path.join(ROOT, group)) ? fs.readdirSync(path.join(ROOT, group)) : []) {
      files.push(...inDir(`${group}/${pkg}`, /^README\.md$/));
    }
  }
  files.push(...['native/README.md', 'tools/reference/README.md'].filter((f) => fs.existsSync(path.join(ROOT, f))));
  return files.sort();
}

/** Every source file that may cite REFERENCE.md, relative to the root (build outputs and dependencies skipped). */
function citingFiles(dir = ''): string[] {
  const out: string[] = [];
  for (const entry of fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
    const rel = dir === '' ? entry.name : `${dir}/${entry.name}`;
    if (entry.isDirectory()) {
      if (!SKIP_DIRS.has(entry.name) && rel !== 'tools/reference/work') out.push(...citingFiles(rel));
    } else if (entry.isFile() && CITING_EXTENSIONS.has(path.extname(entry.name))) {
      out.push(rel);
    }
  }
  return out;
}

/** A markdown line with its 1-based number, outside fenced code blocks. */
interface ProseLine {
  readonly line: number;
  readonly text: string;
}

function proseLines(markdown: string): ProseLine[] {
  const out: ProseLine[] = [];
  let fenced = false;
  markdown.split('\n').forEach((text, i) => {
    if (/^\s*(```|~~~)/.test(text)) {
      fenced = !fenced;
      return;
    }
    if (!fenced) out.push({ line: i + 1, text });
  });
  return out;
}

/** The line with its inline code spans removed (links inside code are not links). */
function withoutCode(text: string): string {
  return text.replace(/(`+)[^`]*?\1/g, '');
}

/** GitHub's heading anchors of a markdown file (lower case, punctuation dropped, spaces → '-', `-N` for repeats). */
function headingAnchors(markdown: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const { text } of proseLines(markdown)) {
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(text);
    if (m === null) continue;
    const plain = (m[1] ?? '').replace(/`/g, '').replace(/\[([^\]]*)\]\([^)]*\)/g, '$1');
    const base = plain
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

function read(rel: string): string {
  return fs.readFileSync(path.join(ROOT, rel), 'utf8');
}

/** Whether git ignores `rel` (a downloaded model, a build output); false when git is unavailable. */
function gitIgnored(rel: string): boolean {
  const r = spawnSync('git', ['check-ignore', '-q', '--no-index', rel], { cwd: ROOT });
  return r.status === 0;
}

describe('docs stay inside the repository', () => {
  const files = docFiles();

  it('finds the documents it checks', () => {
    expect(files).toContain('README.md');
    expect(files).toContain('docs/ARCHITECTURE.md');
    expect(files).toContain('docs/REFERENCE.md');
  });

  it('every relative markdown link resolves to a file (and its #anchor to a heading)', () => {
    const broken: string[] = [];
    for (const file of files) {
      const markdown = read(file);
      for (const { line, text } of proseLines(markdown)) {
        for (const m of withoutCode(text).matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
          const target = m[1] ?? '';
          if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto:
          const [rawPath = '', anchor] = target.split('#', 2);
          const linked =
            rawPath === '' ? file : path.posix.normalize(path.posix.join(path.posix.dirname(file), rawPath));
          if (linked.startsWith('..') || !fs.existsSync(path.join(ROOT, linked))) {
            broken.push(`${file}:${line}: ${target} (no file ${linked} in the repository)`);
            continue;
          }
          if (anchor !== undefined && anchor !== '' && linked.endsWith('.md')) {
            if (!headingAnchors(read(linked)).has(decodeURIComponent(anchor).toLowerCase())) {
              broken.push(`${file}:${line}: ${target} (no heading #${anchor} in ${linked})`);
            }
          }
        }
      }
    }
    expect(broken, `broken links:\n${broken.join('\n')}`).toEqual([]);
  });

  it('every backticked repository path exists (or is git-ignored)', () => {
    const missing: string[] = [];
    for (const file of files) {
      for (const { line, text } of proseLines(read(file))) {
        for (const m of text.matchAll(/`([^`\n]+)`/g)) {
          const token = (m[1] ?? '').trim();
          // A package's README also names its own files (`src/…`, `test/…` of that package).
          const isPackageReadme = /^(packages|examples)\/[^/]+\/README\.md$/.test(file);
          const prefixes = isPackageReadme
            ? [...TOP_LEVEL, ...TOP_LEVEL_MORE, 'src/']
            : [...TOP_LEVEL, ...TOP_LEVEL_MORE];
          if (!prefixes.some((dir) => token.startsWith(dir))) continue;
          if (NOT_A_PATH.test(token)) continue;
          const rel = token.replace(/\/$/, '');
          const local = path.posix.join(path.posix.dirname(file), rel);
          if (fs.existsSync(path.join(ROOT, rel)) || gitIgnored(rel)) continue;
          if (isPackageReadme && fs.existsSync(path.join(ROOT, local))) continue;
          missing.push(`${file}:${line}: \`${token}\``);
        }
      }
    }
    expect(missing, `backticked paths that do not exist:\n${missing.join('\n')}`).toEqual([]);
  });

  it('every REFERENCE.md §N citation names a section of docs/REFERENCE.md', () => {
    const sections = new Set<number>();
    for (const m of read('docs/REFERENCE.md').matchAll(/^## (\d+)\. \S/gm)) sections.add(Number(m[1]));
    expect(sections.size).toBeGreaterThanOrEqual(12);

    const unresolved: string[] = [];
    let citations = 0;
    for (const file of citingFiles()) {
      const lines = read(file).split('\n');
      lines.forEach((text, i) => {
        // `§3`, `§1, §8`, `§4 / §8`, `§3-5` (a range).
        for (const m of text.matchAll(/REFERENCE\.md\s+§(\d+)((?:\s*(?:,|\/|-|–)\s*§?\d+)*)/g)) {
          const numbers = [Number(m[1])];
          for (const part of (m[2] ?? '').matchAll(/([,/\-–])\s*§?(\d+)/g)) {
            const n = Number(part[2]);
            const last = numbers[numbers.length - 1] ?? n;
            if (part[1] === '-' || part[1] === '–') {
              for (let k = last + 1; k <= n; k++) numbers.push(k);
            } else {
              numbers.push(n);
            }
          }
          citations += 1;
          for (const n of numbers) {
            if (!sections.has(n)) unresolved.push(`${file}:${i + 1}: REFERENCE.md §${n} (no "## ${n}." heading)`);
          }
        }
      });
    }
    expect(citations, 'citations found').toBeGreaterThan(40);
    expect(unresolved, `citations without a section:\n${unresolved.join('\n')}`).toEqual([]);
  });
});
