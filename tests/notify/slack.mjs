// Checks Slack messages against Slack's published Block Kit types (@slack/types), with the TypeScript compiler:
// reads a JSON array of messages on stdin, prints each type error found and exits 1 when there is one.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const here = dirname(fileURLToPath(import.meta.url));
const messages = JSON.parse(await new Promise((resolve) => {
  let text = '';
  process.stdin.on('data', (chunk) => { text += chunk; });
  process.stdin.on('end', () => resolve(text));
}));
const dir = mkdtempSync(join(here, '.check-'));
try {
  const files = messages.map((message, index) => {
    const file = join(dir, `message-${index}.ts`);
    writeFileSync(file, `import type { KnownBlock } from '@slack/types';\n` +
      `export const message: { text: string; blocks: KnownBlock[] } = ${JSON.stringify(message, null, 2)};\n`);
    return file;
  });
  const program = ts.createProgram(files, {
    strict: true,
    noEmit: true,
    module: ts.ModuleKind.Node16,
    moduleResolution: ts.ModuleResolutionKind.Node16,
    target: ts.ScriptTarget.ES2022,
    skipLibCheck: true,
  });
  const problems = ts.getPreEmitDiagnostics(program).map((diagnostic) => {
    const text = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n');
    const where = diagnostic.file ? `${diagnostic.file.fileName.slice(dir.length + 1)}: ` : '';
    return `${where}${text}`;
  });
  for (const problem of problems) console.log(problem);
  process.exitCode = problems.length ? 1 : 0;
} finally {
  rmSync(dir, { recursive: true, force: true });
}
