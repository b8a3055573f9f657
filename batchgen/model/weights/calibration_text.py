"""The text ``--quantization fp8`` calibrates its rounding on (``gptq.py``): short chats of varied kinds
(explanations, instructions, code, lists, numbers, dialogue), so that each projection's recorded inputs
span what a generation job feeds it. None of its questions is, or rephrases, a prompt of the quality
measure (``bench/workloads.py``: ``VARIED_PROMPTS`` and the mixed prompts' questions, which
``tests/model/test_fp8_quality.py`` scores): a rounding must not be judged on its own calibration text."""

from __future__ import annotations

from batchgen.model.tokenize import encode_prompt, has_chat_template
from batchgen.model.weights.calibration_chats import MORE_CHATS

_FIRST_CHATS: tuple[tuple[str, str], ...] = (
    (
        "How do noise-cancelling headphones work?",
        "Tiny microphones on the ear cups pick up the sound around you. A chip inverts that wave and plays "
        "it through the speakers at the same moment, so the two waves cancel where they meet. It works best "
        "on steady low sounds such as engines, while the padding of the ear cups blocks the higher ones.",
    ),
    (
        "Tell a short story about a lost umbrella.",
        "Nobody noticed the umbrella until the rain stopped. It leaned against the bench at platform four, "
        "green with a cracked wooden handle, and when the last train had gone the station master picked it "
        "up and found a name written inside: Margaret, 1962.",
    ),
    (
        "Give me a Go function that sums a slice of integers.",
        "```go\nfunc Sum(values []int) int {\n\ttotal := 0\n\tfor _, v := range values {\n"
        "\t\ttotal += v\n\t}\n\treturn total\n}\n```\n`Sum([]int{4, 5, 6})` returns 15.",
    ),
    (
        "What should I bring to a job interview?",
        "1. Several printed copies of your CV.\n2. A notebook and a pen.\n3. A list of questions for the "
        "interviewer.\n4. Your ID and any certificates they asked for.\n5. The address, the name of the "
        "person you are meeting and their phone number.\n6. A bottle of water and some mints.",
    ),
    (
        "If a train travels 180 km in 2.5 hours, what is its average speed?",
        "Average speed is distance divided by time: 180 km / 2.5 h = 72 km/h. In metres per second that is "
        "72 000 / 3 600 = 20 m/s.",
    ),
    (
        "What does the pancreas do?",
        "The pancreas has two jobs. It makes digestive juices that flow into the small intestine and break "
        "down fats, proteins and carbohydrates, and it releases the hormones insulin and glucagon into the "
        "blood, which keep the level of sugar in the blood within a narrow range.",
    ),
    (
        "Translate into French: The library opens at nine and closes at six.",
        "La bibliothèque ouvre à neuf heures et ferme à dix-huit heures.",
    ),
    (
        "Outline the plot of a heist film in three sentences.",
        "A retired safecracker is pulled back for one last job at a casino vault. Her crew plans every "
        "minute, but a guard recognises one of them and the plan falls apart halfway. In the end she escapes "
        "with only a single envelope, which turns out to hold the deed she wanted all along.",
    ),
    (
        "How can I improve my sleep?",
        "Keep the same bedtime and wake-up time every day, even at weekends. Avoid caffeine after lunch and "
        "screens for the last hour before bed. Keep the bedroom dark, quiet and cool, and if you cannot fall "
        "asleep within twenty minutes, get up and read until you feel tired.",
    ),
    (
        "Write a SQL query that finds the five customers who spent the most.",
        "```sql\nSELECT customer_id, SUM(amount) AS total_spent\nFROM orders\nGROUP BY customer_id\nORDER BY "
        "total_spent DESC\nLIMIT 5;\n```\nThis sums each customer's orders and keeps the five largest.",
    ),
    (
        "Why does ice float on water?",
        "Most liquids shrink as they freeze, but water expands. In ice, each molecule holds its neighbours "
        "at fixed angles through hydrogen bonds, which leaves open space in the crystal, so ice is about "
        "nine percent less dense than liquid water. That is why lakes freeze from the top down.",
    ),
    (
        "Draft a polite reply declining a meeting invitation.",
        "Hi Sam,\n\nThank you for the invitation. Unfortunately I have a conflict on Thursday afternoon and "
        "will not be able to join. Could you share the notes afterwards? I am happy to send my comments by "
        "email before the meeting if that helps.\n\nBest regards,\nAlex",
    ),
    (
        "What is compound interest?",
        "Compound interest is interest earned on both the original amount and the interest already added. "
        "With 1 000 at 5 % a year, you have 1 050 after one year and 1 102.50 after two, because the second "
        "year's interest is paid on 1 050 rather than 1 000.",
    ),
    (
        "Describe a busy market in the morning.",
        "Stalls open before sunrise. Vendors stack oranges into pyramids, fishmongers shout their prices, "
        "and the smell of fresh bread drifts from a corner bakery. By eight o'clock the aisles are crowded "
        "with shoppers carrying baskets, bargaining and greeting neighbours.",
    ),
    (
        "Write a JavaScript function that returns the largest number in an array.",
        "```javascript\nfunction largest(numbers) {\n  if (numbers.length === 0) return undefined;\n  return "
        "numbers.reduce((a, b) => (b > a ? b : a));\n}\n```\n`largest([3, 9, 4])` returns 9.",
    ),
    (
        "Is it better to rent or to buy a home?",
        "It depends on how long you plan to stay, local prices and your savings. Buying builds equity but "
        "costs fees, maintenance and a large deposit; renting is flexible and leaves your savings free to "
        "invest. A rule of thumb is that buying pays off only if you stay at least five to seven years.",
    ),
    (
        "List the noble gases in order of atomic number.",
        "Helium, neon, argon, krypton, xenon and radon, followed by the synthetic oganesson. Their outer "
        "electron shells are full, which is why they hardly react with other elements.",
    ),
    (
        "How does a microwave oven heat food?",
        "A device called a magnetron makes microwaves, which bounce around the metal box. Water molecules in "
        "the food keep turning to follow the wave's rapidly changing field, and that jostling becomes heat. "
        "The turntable moves the food through the hot and cold spots so it heats more evenly.",
    ),
    (
        "Give feedback on this sentence: 'Me and him goes to the gym every days.'",
        "The sentence has three errors. It should read: 'He and I go to the gym every day.' Use the subject "
        "pronouns 'he' and 'I', the plural verb 'go', and the singular 'day' after 'every'.",
    ),
    (
        "What were the main causes of the French Revolution?",
        "Historians usually name a financial crisis after costly wars, a tax system that spared the nobility "
        "and clergy, bread shortages after poor harvests, and Enlightenment ideas about rights and "
        "representation. Together they turned the meeting of the Estates-General in 1789 into a revolution.",
    ),
    (
        "How many seconds are in a day? Show the calculation.",
        "A day has 24 hours, each hour 60 minutes and each minute 60 seconds: 24 x 60 = 1 440 minutes, and "
        "1 440 x 60 = 86 400 seconds.",
    ),
    (
        "Pretend you are a tour guide at an old harbour.",
        "Welcome, everyone! The stone wall on your left was built in 1724 to shelter fishing boats from "
        "winter storms. If you look up at the warehouse roofs, you can still see the iron hooks that lifted "
        "barrels of salted herring. Mind the steps, they are slippery when the tide is in.",
    ),
    (
        "Explain what a database index is to a non-programmer.",
        "An index is like the one at the back of a book. Instead of reading every page to find a word, you "
        "look it up in a short sorted list that tells you where it is. A database keeps such lists for the "
        "columns people search by, so it can jump to the right rows instead of scanning them all.",
    ),
    (
        "Write a bash command that finds all files larger than 100 MB in my home directory.",
        "```bash\nfind ~ -type f -size +100M -exec ls -lh {} + 2>/dev/null\n```\n`-size +100M` keeps files "
        "over 100 MB, and `ls -lh` prints their sizes in a readable form.",
    ),
    (
        "What are some good habits for learning to play the guitar?",
        "Practise a little every day rather than a lot once a week. Start with a few open chords and switch "
        "between them slowly before speeding up. Use a metronome, record yourself now and then, and learn "
        "songs you enjoy so that practice stays fun.",
    ),
    (
        "Calculate 15 % of 240 and explain the steps.",
        "Ten percent of 240 is 24, and five percent is half of that, 12. Adding them gives 24 + 12 = 36, so "
        "15 % of 240 is 36.",
    ),
)

CHATS: tuple[tuple[str, str], ...] = _FIRST_CHATS + MORE_CHATS


def calibration_ids(tokenizer) -> list[list[int]]:
    """Each chat as the model sees it: the question as a prompt (its chat template where it has one), then
    the answer's tokens."""
    chat = has_chat_template(tokenizer)
    return [
        encode_prompt(tokenizer, question, chat) + list(tokenizer.encode(answer, add_special_tokens=False))
        for question, answer in CHATS
    ]
